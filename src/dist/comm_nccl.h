// A td_comm over NCCL (comm.h's contract; docs/dist.md): one rank per GPU, buffers in device
// memory of that GPU, every operation on the communicator's own stream and completed by polling
// an event against the deadline. Built with TANDEM_HAVE_NCCL (the CUDA toolkit's NCCL).
#ifndef TD_DIST_COMM_NCCL_H
#define TD_DIST_COMM_NCCL_H

#include "dist/comm.h"

#ifdef TANDEM_HAVE_NCCL
// Makes this rank's NCCL communicator for the group of `boot` (any td_comm: the local one for
// threads of one process, MPI across processes): rank 0 makes the ncclUniqueId and broadcasts it
// over boot (host memory), then every rank joins on CUDA device `device`. Collective over boot:
// every rank calls it; it blocks until all have joined (bounded by boot's deadline for the id, by
// NCCL's own bootstrap for the join). *out has boot's rank and size and is owned by the caller
// (td_comm_free); boot is not kept. TD_ERR_UNSUPPORTED when there is no such device or NCCL
// cannot start.
td_status td_comm_nccl_create(td_comm *boot, int device, td_comm **out, td_err *err);
#endif

#endif
