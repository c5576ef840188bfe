"""From-scratch NumPy kernels: each op is a *_forward / *_backward pair, side by side."""
from .activations import (ACTIVATIONS, gelu_backward, gelu_forward, gelu_tanh_backward, gelu_tanh_forward,
                          relu_backward, relu_forward, silu_backward, silu_forward)
from .attention import attention_backward, attention_forward, causal_mask
from .embedding import embedding_backward, embedding_forward
from .linear import linear_backward, linear_forward
from .loss import cross_entropy_backward, cross_entropy_forward
from .norms import layernorm_backward, layernorm_forward, rmsnorm_backward, rmsnorm_forward
from .rope import rope_angles, rope_backward, rope_forward
from .softmax import softmax_backward, softmax_forward
