/* gpt2_ckpt.c - a GPT-2's ddp checkpoint read as a model (gpt2_ckpt.h).
 *
 * ddp-train's GPT checkpoints hold the flat parameter buffer in llm.c's layout (wte with its
 * padding rows first) and the fingerprint text config.model, "gpt2 L2 NH2 C64 maxT1024 V50257 T16
 * accum1" (task_gpt.c): the sizes come from that text, except the padded vocabulary, which only
 * wte's rows give (an llm.c file started from may pad otherwise than to 128). The signature's
 * total is checked against the sizes, so a text that does not fit its parameters is refused.
 */
#include "gpt2_ckpt.h"

#include "ddp_checkpoint.h"
#include "in_path.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 1 when the folder at path has a MANIFEST. */
static int has_manifest(const char *path)
{
    char manifest[8192];
    struct stat sb;
    snprintf(manifest, sizeof manifest, "%s/%s", path, DDP_CKPT_MANIFEST);
    return stat(manifest, &sb) == 0;
}

/* 1 when the folder at path is a checkpoint folder's save, complete or not: named step-N.ckpt
 * (--checkpoint-dir's name), or holding a rank's file or a MANIFEST (or their temporary files). */
static int is_save_folder(const char *path)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(base);
    int found = strncmp(base, "step-", 5) == 0 && n > 10 && strcmp(base + n - 5, ".ckpt") == 0;
    DIR *d = found ? NULL : opendir(path);
    struct dirent *de;
    while (d && !found && (de = readdir(d)) != NULL)
        found = strncmp(de->d_name, "rank-", 5) == 0 ||
                strncmp(de->d_name, DDP_CKPT_MANIFEST, strlen(DDP_CKPT_MANIFEST)) == 0;
    if (d)
        closedir(d);
    return found;
}

int gpt2_ckpt_is_ddp(const char *path)
{
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return 0;
    if (S_ISDIR(sb.st_mode))
        return has_manifest(path) || is_save_folder(path);
    char magic[8], why[512];
    int fd = in_path_open(path, NULL, why, sizeof why);
    int ddp = fd >= 0 && read(fd, magic, sizeof magic) == (ssize_t)sizeof magic &&
              memcmp(magic, DDP_CKPT_MAGIC, 8) == 0;
    if (fd >= 0)
        close(fd);
    return ddp;
}

/* DDP_ERR_FORMAT (logged, with the fix) when the folder at path has no MANIFEST. */
static ddp_status check_complete(const char *path, const char *flag)
{
    if (has_manifest(path))
        return DDP_OK;
    DDP_ERROR("%s %s: a checkpoint folder without its %s: a save that was interrupted (killed, or "
              "failed, before rank 0 wrote the %s), not a checkpoint; give a complete step folder "
              "(`ddp-ckpt list` on its --checkpoint-dir says which are complete) or a checkpoint "
              "file", flag, path, DDP_CKPT_MANIFEST, DDP_CKPT_MANIFEST);
    return DDP_ERR_FORMAT;
}

/* The sizes of a GPT-2 checkpoint's state s (see the top of the file). */
static ddp_status read_config(const ddp_state *s, const char *flag, const char *path,
                              gpt2_config *cfg)
{
    const char *model = ddp_state_text(s, "config.model");
    if (!model) {
        DDP_ERROR("%s %s: a ddp checkpoint without the model's configuration (no config.model: a "
                  "parameters-only file?): give a checkpoint that ddp-train --model gpt2 wrote "
                  "(--save or --checkpoint-dir)", flag, path);
        return DDP_ERR_FORMAT;
    }
    *cfg = (gpt2_config){0};
    if (sscanf(model, "gpt2 L%d NH%d C%d maxT%d V%d", &cfg->layers, &cfg->heads, &cfg->channels,
               &cfg->max_seq, &cfg->vocab) != 5) {
        DDP_ERROR("%s %s: a checkpoint of another model (config.model \"%s\"), not of a GPT-2: %s "
                  "takes the checkpoints of ddp-train --model gpt2; to continue this run: ddp-train "
                  "--model %.*s --resume %s", flag, path, model, flag, (int)strcspn(model, " "),
                  model, path);
        return DDP_ERR_FORMAT;
    }
    const ddp_param_desc *d = ddp_state_descs(s);
    for (int i = 0; i < ddp_state_n_params(s); i++)
        if (strncmp(d[i].name, "wte.weight", DDP_NAME_MAX) == 0 && d[i].n_dims == 2 &&
            d[i].shape[1] == cfg->channels)
            cfg->padded_vocab = (int)d[i].shape[0];
    gpt2_config padded = *cfg;
    padded.vocab = cfg->padded_vocab;
    if (cfg->padded_vocab == 0 || gpt2_config_check(cfg) != DDP_OK ||
        gpt2_config_n_params(&padded) != ddp_state_numel(s)) {
        DDP_ERROR("%s %s: the signature (%d parameters, %zu values, wte.weight of %d rows) does not "
                  "fit the configuration \"%s\": a damaged or foreign checkpoint", flag, path,
                  ddp_state_n_params(s), ddp_state_numel(s), cfg->padded_vocab, model);
        return DDP_ERR_FORMAT;
    }
    return DDP_OK;
}

ddp_status gpt2_ckpt_read(const char *path, const char *flag, int verify, gpt2_ckpt *c)
{
    *c = (gpt2_ckpt){0};
    ddp_state *file = NULL;
    ddp_ckpt_dir *dir = NULL;
    c->folder = ddp_checkpoint_is_folder(path);
    ddp_status st = c->folder ? check_complete(path, flag) : DDP_OK;
    if (st != DDP_OK)
        return st;
    /* a folder's values are read by ranges without their CRC-32: with verify each file is checked
     * whole first */
    st = ddp_checkpoint_open(path, verify, &file, &dir);
    if (st != DDP_OK)
        DDP_ERROR("%s %s: cannot read this checkpoint %s (see above)", flag, path,
                  c->folder ? "folder" : "file");
    const ddp_state *s = ddp_checkpoint_state(file, dir);
    if (st == DDP_OK)
        st = read_config(s, flag, path, &c->cfg);
    if (st == DDP_OK) {
        c->n_params = ddp_state_n_params(s);
        c->numel = ddp_state_numel(s);
        c->descs = malloc((size_t)c->n_params * sizeof *c->descs);
        c->params = malloc((c->numel ? c->numel : 1) * sizeof *c->params);
        st = c->descs && c->params ? DDP_OK : DDP_ERR_NOMEM;
    }
    if (st == DDP_OK) {
        memcpy(c->descs, ddp_state_descs(s), (size_t)c->n_params * sizeof *c->descs);
        if (dir)
            st = ddp_ckpt_dir_read_f32(dir, "params", 0, c->numel, c->params);
        else
            memcpy(c->params, ddp_state_params(s), c->numel * sizeof *c->params);
        ddp_state_u64(s, "step", &c->step);
    }
    ddp_state_destroy(file);
    ddp_ckpt_dir_close(dir);
    if (st != DDP_OK)
        gpt2_ckpt_free(c);
    return st;
}

int gpt2_ckpt_same_signature(const gpt2_ckpt *c, const ddp_param_desc *descs, int n_params,
                            const char *flag, const char *path)
{
    if (c->n_params != n_params) {
        DDP_ERROR("%s %s: the checkpoint has %d parameter tensors, the model built from its sizes "
                  "%d", flag, path, c->n_params, n_params);
        return 0;
    }
    for (int i = 0; i < n_params; i++) {
        const ddp_param_desc *a = &c->descs[i], *b = &descs[i];
        int same = strncmp(a->name, b->name, DDP_NAME_MAX) == 0 && a->n_dims == b->n_dims;
        for (int k = 0; same && k < a->n_dims; k++)
            same = a->shape[k] == b->shape[k];
        if (!same) {
            DDP_ERROR("%s %s: parameter %d is '%.*s' (%d dimensions) in the checkpoint, '%.*s' "
                      "(%d) in the model built from its sizes", flag, path, i, DDP_NAME_MAX,
                      a->name, a->n_dims, DDP_NAME_MAX, b->name, b->n_dims);
            return 0;
        }
    }
    return 1;
}

void gpt2_ckpt_free(gpt2_ckpt *c)
{
    free(c->descs);
    free(c->params);
    *c = (gpt2_ckpt){0};
}
