"""The JAX/Flax learner: trainable policies, cross-harness GRPO and RLOO, and the service that trains from the log."""

import logging
import warnings

# JAX reports each accelerator backend it does not find (no TPU library here) as a warning: noise on a CPU
# machine, and on an accelerator the backend it does find is what `jax.default_backend()` says.
logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
# Python warns at every fork of a process that has JAX's threads. hx forks only through subprocess, which
# execs at once (the JVM of a benchmark, a sandbox), so the child never runs JAX's state: the warning is noise.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
