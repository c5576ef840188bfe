"""`ffnlab experiment NAME`: one claim about the MLP, measured over seeds (experiments/NAME.toml)."""
COMMAND = "experiment"
HELP = "run a claim's experiment grid (experiments/NAME.toml) over seeds; tables with 95% intervals, plots"


def add_arguments(p):
    from .common import positive
    from .scaleout import add_ray_arguments
    p.add_argument("name", metavar="NAME", nargs="?", default=None,
                   help="an experiment of experiments/ (width, activation, dropout, bias, gating, compression, lora) "
                        "or a path to a .toml file")
    p.add_argument("--list", action="store_true", help="list the experiments and their claims")
    p.add_argument("--claim", action="store_true",
                   help="every experiment that tests NAME's claim (the same experiment.claim: its sizes and token "
                        "budgets, e.g. width, width-d128, width-d128-long), one after another, each as if run alone")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="runs directory (default experiments/runs/NAME, NAME-quick with --quick); rerunning the same "
                        "command resumes it, and runs another experiment trained (DIR/../shared) are reused")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="where results.json goes (default experiments/results/NAME; with --quick or --out: OUT/results)")
    p.add_argument("--plot", action="store_true",
                   help="only redraw the PNGs from the stored results.json (no training)")
    p.add_argument("--docs", default=None, metavar="DIR", help="where --plot writes its PNGs (default docs/)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object (no per-step curves)")
    p.add_argument("--seeds", type=positive("--seeds"), default=None, metavar="N", help="seeds per variant (default: the file's)")
    p.add_argument("--quick", action="store_true", help="the file's [quick] settings: a CI-sized grid of tiny runs")
    p.add_argument("--data", default=None, metavar="FILE", help="training text instead of the file's experiment.data")
    p.add_argument("-t", "--threads", type=int, default=1, metavar="N",
                   help="threads for BLAS and compiled kernels in each run (default 1: runs are small)")
    add_ray_arguments(p)


def run(args):
    import argparse
    import json
    import os

    from ..errors import UsageError
    from ..experiments import config as cfgmod
    from ..experiments.runner import compute_line, markdown, read_results, write_results

    if args.list:
        for n in cfgmod.names():
            e = cfgmod.load(n, check_data=False)
            print(f"{n}: {e.claim}")
        return 0
    if not args.name:
        raise UsageError("give an experiment NAME (ffnlab experiment --list)")
    if args.claim:
        if args.out or args.results:
            raise UsageError("--claim runs several experiments, each into its own default directories: "
                             "leave out --out and --results")
        if args.name not in cfgmod.names():
            raise UsageError(f"--claim takes the name of an experiment of experiments/, not {args.name!r} "
                             f"(ffnlab experiment --list)")
        claim, names = cfgmod.same_claim(args.name)
        print(f"claim: {claim}\nexperiments: {', '.join(names)}")
        for n in names:
            if not args.json:
                print(f"\n== {n}")
            code = run(argparse.Namespace(**{**vars(args), "name": n, "claim": False}))
            if code:
                return code
        return 0
    exp = cfgmod.load(args.name, quick=args.quick, seeds=args.seeds, data=args.data)
    suffix = "-quick" if args.quick else ""
    out = args.out or os.path.join(cfgmod.EXPERIMENTS, "runs", exp.name + suffix)
    results = args.results or (os.path.join(out, "results") if (args.quick or args.out)
                               else os.path.join(cfgmod.EXPERIMENTS, "results", exp.name))
    if args.plot:
        from ..experiments.plots import plot
        res = read_results(results)
        print(markdown(res))                          # the tables docs/experiments.md quotes, from the same file
        print(compute_line(res))
        for path in plot(res, args.docs or os.path.join(cfgmod.ROOT, "docs")):
            print(f"wrote {path}")
        return 0
    from .scaleout import backend
    from ..experiments.runner import run as run_experiment
    res = run_experiment(exp, out, backend(args), log=(lambda s: None) if args.json else print)
    write_results(res, results)
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if k != "runs"}))
        return 0
    print(markdown(res))
    print(compute_line(res))
    print(f"results: {os.path.join(results, 'results.json')} (plots: ffnlab experiment {args.name} --plot)")
    return 0
