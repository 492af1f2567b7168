// The communicator a command-line tool runs on: every process of the job when it was started by
// mpirun (the MPI implementation), one rank otherwise (the local implementation's self
// communicator). `tandem train` calls this; nothing else needs to know which it got.
#ifndef TD_DIST_WORLD_H
#define TD_DIST_WORLD_H

#include <stdbool.h>

#include "dist/comm.h"

// True when this process was started by mpirun/mpiexec: OpenMPI's OMPI_COMM_WORLD_SIZE or
// OMPI_COMM_WORLD_RANK, or PMIx's PMIX_RANK, is in the environment. Needs no MPI library.
bool td_comm_mpi_launched(void);

// Under mpirun: td_comm_mpi_create (collective over the job; see comm_mpi.h), or, in a build
// without MPI, TD_ERR_UNSUPPORTED when the job has more than one process (each would otherwise
// train alone). Otherwise td_comm_self_create. *out is owned by the caller (td_comm_free).
td_status td_comm_world_create(td_comm **out, td_err *err);

#endif
