"""The key ids trellis.torch reserves for itself, in one place so no two uses share one.

User keys are below 2**62; each internal channel has its own id above it. A shared id made every
job with crash recovery fail at start-up ("key id declared twice")."""

BROADCAST_CHANNEL = 1 << 62         # trellis.torch's broadcast channel (parameters, objects)
REJOIN_ARENA = (1 << 62) + 1        # crash recovery: a live worker's last step (_rejoin)
COLLECTIVES = (1 << 62) + 2         # allreduce / allgather / broadcast of tensors (_collectives)
BUFFERS = (1 << 62) + 16            # BatchNorm buffers from rank 0 (_buffers)
JOIN_CONTROL = (1 << 62) + 17       # join(): one element per worker (_grad_sync)

ALL = (BROADCAST_CHANNEL, REJOIN_ARENA, COLLECTIVES, BUFFERS, JOIN_CONTROL)
