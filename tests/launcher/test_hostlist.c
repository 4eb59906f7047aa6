/* test_hostlist.c - test 5: launch_hostlist_expand agrees with Slurm's own `scontrol show hostnames`
 * on tricky lists (zero padding, several bracket groups, commas inside and outside brackets,
 * suffixes after brackets, malformed ranges), plus a few expansions written out by hand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "launcher.h"

static const char *const cases[] = {
    "gpu-a[007-009,11],b3", "n[08-11]", "n[9-11]", "a[01-3]", "a[1-003]", "a[7-009]", "a[00-02]",
    "rack[1-2]-node[01-02]", "n[0-1]-[8-9]", "a[1-2][3-4]", "h[1-2]x[3]", "a[1-2]b[3]",
    "a[1,2],,b", ",a", "a,", "a[1-2],a[1-2]", "n[1,1]", "n1[0-1]", "a-[1-2]", "[1-2]", "a]",
    "n[000001-000003]", "node1,node2,node3", "x[1-2],y[3-4,7],z",
    /* rejected by Slurm */
    "a[1-2]b", "n[1-2]-ib", "x[1-2]y[3-4]z", "n[1,3-4]x,m5", "n[2-1]", "n[1-3-5]", "n[]", "a[x-y]",
    "a[1-2]]", "n[010-9]", "n[0-65536]",
};

/* Writes a minimal slurm.conf (scontrol needs a configuration source even offline). */
static void write_conf(char *dir_template)
{
    char path[256];
    FILE *f;
    if (!mkdtemp(dir_template)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(path, sizeof path, "%s/slurm.conf", dir_template);
    f = fopen(path, "w");
    fputs("ClusterName=hostlisttest\nSlurmctldHost=localhost\n", f);
    fclose(f);
    setenv("SLURM_CONF", path, 1);
}

/* Slurm's expansion as one line "a b c", or "INVALID" when scontrol refuses the list. */
static void slurm_expand(const char *list, char *out, size_t len)
{
    char cmd[512], line[256];
    size_t used = 0;
    FILE *p;
    snprintf(cmd, sizeof cmd, "scontrol show hostnames '%s' 2>&1", list);
    p = popen(cmd, "r");
    out[0] = '\0';
    while (p && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (strstr(line, "Invalid hostlist") || strstr(line, "error:")) {
            snprintf(out, len, "INVALID");
            used = len;
        } else if (used < len) {
            used += (size_t)snprintf(out + used, len - used, "%s%s", used ? " " : "", line);
        }
    }
    if (p)
        pclose(p);
}

static void ours_expand(const char *list, char *out, size_t len)
{
    struct launch_hostlist hl;
    char err[LAUNCH_ERRMSG_LEN];
    size_t used = 0;
    out[0] = '\0';
    if (launch_hostlist_expand(list, &hl, err, sizeof err) != 0) {
        snprintf(out, len, "INVALID");
        return;
    }
    for (size_t i = 0; i < hl.n && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%s", i ? " " : "", hl.names[i]);
    launch_hostlist_free(&hl);
}

static void check_by_hand(void)
{
    char got[256];
    ours_expand("gpu-a[007-009,11],b3", got, sizeof got);
    CHECK(strcmp(got, "gpu-a007 gpu-a008 gpu-a009 gpu-a11 b3") == 0, "got '%s'", got);
    ours_expand("r[1-2]-n[01-02]", got, sizeof got);
    CHECK(strcmp(got, "r1-n01 r1-n02 r2-n01 r2-n02") == 0, "got '%s'", got);
    ours_expand("n[1-2]-ib", got, sizeof got);
    CHECK(strcmp(got, "INVALID") == 0, "a suffix after the last group must be refused, got '%s'", got);
}

int main(void)
{
    static char want[1 << 20], got[1 << 20];
    char dir[] = "/tmp/ddp-hostlist-XXXXXX", path[300];
    write_conf(dir);
    check_by_hand();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        slurm_expand(cases[i], want, sizeof want);
        ours_expand(cases[i], got, sizeof got);
        CHECK(want[0] != '\0', "scontrol gave nothing for '%s'", cases[i]);
        CHECK(strcmp(want, got) == 0, "'%s': scontrol says '%.200s', we say '%.200s'", cases[i], want, got);
    }
    snprintf(path, sizeof path, "%s/slurm.conf", dir);
    unlink(path);
    rmdir(dir);
    return CHECK_DONE();
}
