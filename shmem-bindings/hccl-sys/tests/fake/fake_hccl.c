/*
 * A fake libhccl.so for the binding tests: the HCCL entry points the project calls, with their C names. Calls are
 * logged (fake_take_log); fake_set_result makes a function return a chosen HcclResult. Written for this project;
 * not vendor code, and it forms no real communicator.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define FAKE_CODE_TYPE unsigned
#include "../../../ascendcl-sys/tests/fake/fake_common.h"

typedef struct { char internal[4108]; } root_info;
typedef struct { uint32_t rank, size; } communicator;
static communicator comms[4];
static int used;

EXPORT unsigned HcclGetRootInfo(root_info *root) {
    ENTER("HcclGetRootInfo");
    memset(root, 0, sizeof *root);
    snprintf(root->internal, sizeof root->internal, "fake-root");
    return 0;
}

EXPORT unsigned HcclCommInitRootInfo(uint32_t n_ranks, const root_info *root, uint32_t rank, void **comm) {
    ENTER("HcclCommInitRootInfo n_ranks=%u root=%s tail=%d rank=%u", n_ranks, root->internal, root->internal[4107], rank);
    if (rank >= n_ranks || strcmp(root->internal, "fake-root") != 0) return 1; /* HCCL_E_PARA */
    if (used == 4) return 3;                                                    /* HCCL_E_MEMORY */
    comms[used] = (communicator){rank, n_ranks};
    *comm = &comms[used++];
    return 0;
}

EXPORT unsigned HcclGetRankId(void *comm, uint32_t *rank) {
    ENTER("HcclGetRankId");
    *rank = ((communicator *)comm)->rank;
    return 0;
}

EXPORT unsigned HcclGetRankSize(void *comm, uint32_t *size) {
    ENTER("HcclGetRankSize");
    *size = ((communicator *)comm)->size;
    return 0;
}

EXPORT unsigned HcclCommDestroy(void *comm) {
    ENTER("HcclCommDestroy");
    return comm ? 0 : 2; /* HCCL_E_PTR */
}
