// A td_comm over MPI (comm.h's contract; docs/dist.md "The MPI implementation"): one rank per
// process of an mpirun job, host buffers, every operation non-blocking point-to-point underneath
// and completed by polling against the deadline. Built with TANDEM_HAVE_MPI (OpenMPI from
// Debian: libopenmpi-dev). Most callers want td_comm_world_create (dist/world.h), which picks this
// one under mpirun.
#ifndef TD_DIST_COMM_MPI_H
#define TD_DIST_COMM_MPI_H

#include "dist/comm.h"

#ifdef TANDEM_HAVE_MPI
// Makes this process's rank of a communicator over every process of MPI_COMM_WORLD (duplicated:
// tandem's traffic never mixes with the caller's). Initializes MPI (MPI_THREAD_SERIALIZED, or
// what the library provides) unless the caller already has; then the td_comm_free of the last
// MPI communicator finalizes it, and MPI cannot be initialized again in this process (a later
// create is TD_ERR_UNSUPPORTED). Collective over MPI_COMM_WORLD: every process calls it, in the
// same order as its other creates; it waits for all of them at most TD_COMM_DEFAULT_TIMEOUT_MS
// (TD_ERR_TIMEOUT). *out (rank and size of MPI_COMM_WORLD) is owned by the caller (td_comm_free).
// Create and free from one thread; the communicator itself from one thread at a time.
td_status td_comm_mpi_create(td_comm **out, td_err *err);
#endif

#endif
