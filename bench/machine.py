"""What machine a benchmark ran on, for the line every bench script prints with its figures."""
import platform


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name"; elsewhere platform.processor())."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"
