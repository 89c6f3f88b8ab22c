/* Stand-ins for ACL functions the wheel imports at load time that cann-twin does not export yet (the shareable
 * handle import is being added to cann-twin separately). tests/support/twin_cann_libs.sh compiles the ones the
 * cdylib lacks into libmetadef.so, so `import mooncake.engine` resolves; each returns
 * ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000). The transfer-engine path never calls them. */
#include <stdint.h>

#ifdef TWIN_PENDING_IMPORT_V2
int aclrtMemImportFromShareableHandleV2(void *shareableHandle, int shareType, uint64_t flags, void **handle) {
    (void)shareableHandle;
    (void)shareType;
    (void)flags;
    (void)handle;
    return 207000;
}
#endif
