"""`ffnlab ablate`: train a grid of FFN variants on one text file and compare them."""
COMMAND = "ablate"
HELP = "train FFN variants (kind x width x seed) with one token budget; CSV/JSON results and PNG plots"


def _list(kind):
    def parse(s):
        try:
            return [kind(x) for x in s.split(",") if x.strip()]
        except ValueError:
            import argparse
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}")
    return parse


def add_arguments(p):
    from .common import add_threads_argument, needs, positive, positive_float, refuse_together
    p.add_argument("--data", required=True, help="UTF-8 text file (byte-level tokens; the last --val-frac is held out)")
    p.add_argument("--out", required=True, help="results directory; rerunning the same command resumes it")
    p.add_argument("--ffn", type=_list(str), default=["gelu", "relu", "swiglu", "geglu"],
                   help="comma-separated FFN kinds: gelu, gelu_tanh, relu, swiglu, geglu, moe (default gelu,relu,swiglu,geglu)")
    p.add_argument("--experts", type=positive("--experts"), default=4, help="--ffn moe: experts per layer (default 4)")
    p.add_argument("--top-k", type=positive("--top-k"), default=1, help="--ffn moe: experts per token (default 1)")
    p.add_argument("--moe-match", type=_list(str), default=["active", "total"],
                   help="--ffn moe: comma-separated: active (the k experts a token runs hold mult*d_model "
                        "worth of MLP: equal FLOPs) and/or total (all E experts do: equal memory) (default both)")
    p.add_argument("--mult", type=_list(float), default=[1, 2, 4, 8],
                   help="comma-separated widths as multiples of d_model: d_ff = mult * d_model (default 1,2,4,8)")
    p.add_argument("--match-params", action="store_true",
                   help="gated FFNs get 2/3 of the width (mult 4 -> 8/3 d_model) so each mult has equal parameters")
    p.add_argument("--seeds", type=positive("--seeds"), default=2, help="seeds per variant (default 2)")
    p.add_argument("--jobs", type=positive("--jobs"), default=1, help="runs trained in parallel processes (default 1)")
    add_threads_argument(p, "idle cores / --jobs, at least 1")
    p.add_argument("--n-layer", type=positive("--n-layer"), default=2, help="blocks (default 2)")
    p.add_argument("--d-model", type=positive("--d-model"), default=64, help="residual width (default 64)")
    p.add_argument("--n-head", type=positive("--n-head"), default=4, help="attention heads (default 4)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    p.add_argument("--warmup", type=int, default=30, help="warmup steps (default 30)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices (default 0.1)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="max global gradient norm, 0 = off (default 1.0)")
    p.add_argument("--eval-every", type=int, default=50, help="evaluate every N steps (default 50)")
    p.add_argument("--eval-batches", type=int, default=8, help="batches per evaluation (default 8)")
    p.add_argument("--ckpt-every", type=int, default=100, help="checkpoint every N steps (default 100)")
    from .scaleout import add_ray_arguments
    add_ray_arguments(p)
    refuse_together(p, "--ray", "--jobs", "--ray runs one run per worker node; --jobs is the local process pool")
    p.add_argument("--early-stop", action="store_true",
                   help="run the grid as Ray Tune trials under the ASHA scheduler, which stops the runs whose val loss "
                        "is weak at a rung (pip install ffnlab[ray]); on --ray's cluster, else a new local instance "
                        "on 127.0.0.1 (docs/scale-out.md)")
    p.add_argument("--grace-period", type=positive("--grace-period"), default=None, metavar="STEPS",
                   help="--early-stop: steps a run trains before it can be stopped, the first rung (default: the first "
                        "evaluation at or past --steps/4)")
    p.add_argument("--reduction-factor", type=positive_float("--reduction-factor"), default=None, metavar="F",
                   help="--early-stop: the best 1/F of the runs at a rung go on; rungs at grace x F^k steps (default 3)")
    refuse_together(p, "--early-stop", "--jobs", "--early-stop runs the grid as Ray Tune trials; --jobs is the local "
                                                 "process pool")
    for flag in ("--grace-period", "--reduction-factor"):
        needs(p, flag, "--early-stop", "they set the early-stopping scheduler")
    for flag in ("--experts", "--top-k", "--moe-match"):
        needs(p, flag, "--ffn=moe", "only the mixture-of-experts variants have experts")


def run(args):
    import os

    from ..errors import UsageError
    from ..pictures import check_folder, pyplot, written
    from ..training.ablate import markdown_table, run_ablation
    from ..training.trainer import TrainSettings

    from ..threads import default_threads
    threads = args.threads if args.threads and args.threads > 0 else max(1, default_threads() // args.jobs)
    if not args.ffn or not args.mult:
        raise UsageError("--ffn and --mult need at least one value each")
    # every variant: the Llama block (RMSNorm, RoPE, no biases, untied head); only the MLP changes
    model = dict(arch="llama", n_layer=args.n_layer, d_model=args.d_model, n_head=args.n_head, d_ff=args.d_model,
                 norm="rmsnorm", positions="rope", vocab_size=256, n_ctx=args.seq_len, tie_embeddings=False)
    settings = TrainSettings(steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr, warmup=args.warmup,
                             weight_decay=args.weight_decay, grad_clip=args.grad_clip, eval_every=args.eval_every,
                             eval_batches=args.eval_batches, ckpt_every=args.ckpt_every)
    settings.validate()
    check_folder(args.out, "--out")                    # the plots are checked before the training, not after
    pyplot()
    if settings.warmup_warning():
        import sys
        print(settings.warmup_warning(), file=sys.stderr, flush=True)
    from dataclasses import asdict
    base = {"model": model, "settings": asdict(settings)}
    moe = None
    if "moe" in args.ffn:
        bad = [m for m in args.moe_match if m not in ("active", "total")]
        if bad or not args.moe_match:
            raise UsageError(f"--moe-match takes active and/or total, got {','.join(args.moe_match)}")
        if args.top_k > args.experts:
            raise UsageError(f"--top-k {args.top_k} exceeds --experts {args.experts}")
        moe = (args.experts, args.top_k, args.moe_match)
    train_runs, early_stop = None, None
    if args.early_stop:                                               # Tune trials, ASHA stopping the weak
        from ..training.tune_grid import DEFAULT_REDUCTION_FACTOR, default_grace_period, require_tune, train_runs_asha
        require_tune()
        rf = args.reduction_factor if args.reduction_factor is not None else DEFAULT_REDUCTION_FACTOR
        if rf <= 1:
            raise UsageError(f"--reduction-factor must exceed 1 (the share of runs that go on is 1/F), got {rf:g}")
        grace = args.grace_period or default_grace_period(args.steps, args.eval_every)
        if grace > args.steps:
            raise UsageError(f"--grace-period {grace} exceeds --steps {args.steps}: no run could be stopped")
        early_stop = {"scheduler": "asha", "grace_period": grace, "reduction_factor": rf}
        trial_threads = args.threads if args.threads and args.threads > 0 else 1     # CPUs per trial
        train_runs = train_runs_asha(args.ray, args.workers, args.data, trial_threads, early_stop)
    elif args.ray is not None:                                        # each run a unit on the cluster
        from ..training.grid import train_runs_on
        from .scaleout import backend
        train_runs = train_runs_on(backend(args), args.data)
    rows = run_ablation(args.data, args.out, base, args.ffn, args.mult, args.seeds, args.match_params,
                        jobs=args.jobs, threads=threads, moe=moe, train_runs=train_runs, early_stop=early_stop)
    from ..training.plots import plot_all
    tokens = args.steps * args.batch * args.seq_len
    budget = f"{tokens / 1e6:.2f}M" if tokens >= 1e5 else f"{tokens / 1e3:.1f}k"
    title = (f"{os.path.basename(args.data)}: {args.n_layer} layer{'s' if args.n_layer > 1 else ''}, d_model {args.d_model}, {budget} tokens/run, "
             f"{args.seeds} seed{'s' if args.seeds > 1 else ''}{', params matched' if args.match_params else ''}")
    print(markdown_table(rows), flush=True)            # the table stands whatever happens to the plots
    with written(args.out, "--out"):
        pngs = plot_all(rows, args.out, title)
    print(f"results: {os.path.join(args.out, 'results.csv')}, results.json; plots: "
          + ", ".join(os.path.basename(p) for p in pngs))
    return 0
