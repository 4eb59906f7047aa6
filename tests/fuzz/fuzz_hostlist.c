/* fuzz_hostlist.c - libFuzzer harness: launch_hostlist_expand (launcher/hostlist.c) on any string.
 * Besides the sanitizers' checks: on success each name is non-empty, shorter than LAUNCH_HOST_LEN and
 * holds no comma or opening bracket; on failure the list is empty and the message says why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "launcher.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *list = malloc(size + 1), err[LAUNCH_ERRMSG_LEN] = "";
    struct launch_hostlist hl;
    if (!list)
        return 0;
    memcpy(list, data, size);
    list[size] = '\0';
    if (launch_hostlist_expand(list, &hl, err, sizeof err) == 0) {
        for (size_t i = 0; i < hl.n; i++) {
            size_t len = strlen(hl.names[i]);
            if (len == 0 || len >= LAUNCH_HOST_LEN || strpbrk(hl.names[i], ",["))
                abort();
        }
    } else if (err[0] == '\0' || hl.n != 0 || hl.names != NULL) {
        abort();
    }
    launch_hostlist_free(&hl);
    free(list);
    return 0;
}
