// td_comm_world_create (world.h): which communicator a process started this way should use.
#include "dist/world.h"

#include <stdlib.h>

#ifdef TANDEM_HAVE_MPI
#include "dist/comm_mpi.h"
#endif

static bool env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

bool td_comm_mpi_launched(void) {
    return env_set("OMPI_COMM_WORLD_SIZE") || env_set("OMPI_COMM_WORLD_RANK") || env_set("PMIX_RANK");
}

td_status td_comm_world_create(td_comm **out, td_err *err) {
    *out = NULL;
    if (!td_comm_mpi_launched()) return td_comm_self_create(out, err);
#ifdef TANDEM_HAVE_MPI
    return td_comm_mpi_create(out, err);
#else
    // A job of one process is a plain run; more would each run alone, which is never wanted.
    const char *size = getenv("OMPI_COMM_WORLD_SIZE"), *rank = getenv("PMIX_RANK");
    if ((size && atoi(size) > 1) || (rank && atoi(rank) > 0))
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "started by mpirun with more than one process, but this tandem was built without MPI "
                          "(install libopenmpi-dev and rebuild with -DTANDEM_MPI=ON)");
    return td_comm_self_create(out, err);
#endif
}
