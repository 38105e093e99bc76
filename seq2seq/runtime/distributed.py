"""Where a run computes: joining a multi-process run, the device mesh, FSDP shardings, and
each process's rows of a batch.

The mesh has a `data` and an `fsdp` axis. Batches are split over both; the train state only
over `fsdp`. Across hosts (`config.distributed`), every process runs the same program on its
own rows of each global batch.
"""

import jax
import ml_collections
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from seq2seq.errors import UserError


def initialize_distributed(d: ml_collections.ConfigDict) -> None:
  """Joins a multi-process run (`config.distributed`) before JAX touches any device.

  With `num_processes == 1` and no `coordinator_address` (the defaults) this
  does nothing. Otherwise every process calls `jax.distributed.initialize`;
  fields left empty (address "", process_id -1, num_processes 0) come from the
  environment: JAX_COORDINATOR_ADDRESS or the Slurm / Open MPI / Cloud TPU /
  Kubernetes detection of `jax.distributed`.
  """
  if jax.distributed.is_initialized():
    return
  if d.num_processes == 1 and not d.coordinator_address:
    return
  # JAX's preemption service would take SIGTERM from our handlers (it catches the signal in
  # C++ for `reached_preemption_sync_point`): `StopSignals` agrees on stops itself.
  jax.config.update("jax_enable_preemption_service", False)
  jax.distributed.initialize(coordinator_address=d.coordinator_address or None,
                             num_processes=d.num_processes or None,
                             process_id=None if d.process_id < 0 else d.process_id)


def make_mesh(fsdp: int) -> jax.sharding.Mesh:
  """Every device as a `data` x `fsdp` mesh, `fsdp` (config.train.fsdp) devices deep."""
  if fsdp < 1 or jax.device_count() % fsdp:
    raise UserError(f"config.train.fsdp={fsdp} does not divide the {jax.device_count()}"
                    " devices; use a divisor of the device count (1 = no sharding).")
  # Auto axes: XLA propagates the shardings and inserts the all-reduces / all-gathers.
  return jax.make_mesh((jax.device_count() // fsdp, fsdp), ("data", "fsdp"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Rows of a batch split over every device of the mesh (both axes)."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def fsdp_sharding(mesh: jax.sharding.Mesh, x) -> NamedSharding:
  """Where one leaf of the train state lives on a mesh with an `fsdp` axis.

  A matrix (or larger) is split along its largest dimension that the `fsdp`
  axis divides; XLA gathers it for the forward/backward pass and scatters the
  gradient (ZeRO-3 / FSDP). Scalars, biases and norms stay replicated.
  """
  shards = mesh.shape["fsdp"]
  dims = [i for i in range(x.ndim) if x.shape[i] % shards == 0]
  if shards == 1 or x.ndim < 2 or not dims:
    return NamedSharding(mesh, P())
  spec = [None] * x.ndim
  spec[max(dims, key=lambda i: x.shape[i])] = "fsdp"
  return NamedSharding(mesh, P(*spec))


def sharded_size(abstract_params, params_sharding) -> int:
  """How many parameters FSDP splits (those not replicated)."""
  return sum(x.size for x, sharding in zip(jax.tree.leaves(abstract_params),
                                           jax.tree.leaves(params_sharding), strict=True)
             if sharding.spec != P())


def with_shardings(abstract, shardings):
  """`abstract`'s ShapeDtypeStructs, placed by `shardings`."""
  return jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                               sharding=sharding),
                      abstract, shardings)


def local_rows(batch: dict) -> dict:
  """This process's contiguous share of a global (every-process-identical) batch."""
  p, n = jax.process_index(), jax.process_count()
  rows = len(batch["src"]) // n
  return {k: v[p * rows:(p + 1) * rows] for k, v in batch.items()}
