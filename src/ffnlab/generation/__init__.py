from .generate import Generation, Timings, generate
from .sampling import SamplingParams, sample
