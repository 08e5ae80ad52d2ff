/*
 * hfmodel.h - a Hugging Face model directory: config.json plus its safetensors weights.
 *
 * The weights are either one model.safetensors, or shards listed by
 * model.safetensors.index.json ({"weight_map": {tensor: file}}). Every shard is opened with
 * st_open() (so fully validated), and every tensor the index names must exist in the file it
 * names. Tensor lookup is by name across all shards.
 *
 * coldstart/ knows nothing about model families: hf_config() hands the parsed config.json
 * to the engine, which reads the fields it needs.
 */
#ifndef HFMODEL_H
#define HFMODEL_H

#include <jansson.h>
#include <stddef.h>

#include "coldstart/safetensors.h"

#define HF_MAX_CONFIG (4u << 20)  /* bytes of config.json */
#define HF_MAX_INDEX (64u << 20)  /* bytes of model.safetensors.index.json */
#define HF_MAX_SHARDS 4096

struct hf_model; /* opaque */

/* Opens dir. Errors name the file at fault: a missing config.json, a missing or malformed
 * shard, an index that names an absent tensor. Free with hf_close(). */
int hf_open(const char *dir, struct hf_model **out, char *err, size_t errsz);
void hf_close(struct hf_model *m); /* NULL is fine */

const char *hf_dir(const struct hf_model *m);
json_t *hf_config(const struct hf_model *m);         /* borrowed; never NULL */
size_t hf_tensor_count(const struct hf_model *m);
const struct st_tensor *hf_tensor_at(const struct hf_model *m, size_t i);
const struct st_tensor *hf_tensor(const struct hf_model *m, const char *name); /* or NULL */
/* The tensors in name order: the i-th, and the one called name with its place in *ix. */
const struct st_tensor *hf_tensor_sorted(const struct hf_model *m, size_t i);
const struct st_tensor *hf_tensor_find(const struct hf_model *m, const char *name, size_t *ix);
size_t hf_shard_count(const struct hf_model *m);
const struct st_file *hf_shard(const struct hf_model *m, size_t i);

#endif
