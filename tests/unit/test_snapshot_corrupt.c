/*
 * test_snapshot_corrupt.c - every corruption of a snapshot is refused with a message naming
 * what is wrong: a flipped byte (the chunk, its byte range and its tensors), a truncated,
 * grown or missing rank file, a foreign header, another format version, a malformed
 * manifest; --no-verify skips the checksums; a write that fails midway leaves nothing.
 */
#include <math.h>

#include "tests/unit/snapshot_fixture.h"

/* ---- corruption --------------------------------------------------------------------------- */

Test(snapshot, flipped_byte_raw_chunk)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap"), *rf = path2(out, "rank-000.bin");
	write_snap(out, true);
	json_t *m = load_manifest(out);
	size_t ci = chunk_inside(m, 0, "embed");
	json_t *c = chunk_of(m, 0, ci);
	flip(rf, jint(c, "file_offset") + 100);
	char want[128];
	snprintf(want, sizeof want, "rank-000.bin: chunk %zu (bytes %llu..%llu) failed its "
		 "checksum; it holds tensor 'embed'", ci, (unsigned long long)jint(c, "offset"),
		 (unsigned long long)(jint(c, "offset") + jint(c, "size")));
	open_fails(out, NULL, WK_EFORMAT, want);

	/* --no-verify skips the checksums: the file opens and the flipped byte shows. */
	struct snap_open_opts nv = {.verify = false};
	struct snap *s = open_ok(out, &nv);
	const struct st_tensor *t = snap_tensor(s, 0, "embed");
	uint64_t at = jint(c, "offset") + 100 - t->offset;
	cr_assert_eq(((const unsigned char *)t->data)[at], fixture[0].data[at] ^ 0x40);
	snap_close(s);
	json_decref(m);
	free(rf);
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot, flipped_byte_mapped)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap"), *rf = path2(out, "rank-001.bin");
	write_snap(out, false);
	json_t *m = load_manifest(out);
	size_t ci = chunk_inside(m, 1, "big");
	json_t *c = chunk_of(m, 1, ci);
	flip(rf, jint(c, "file_offset") + 5);
	char want[128];
	snprintf(want, sizeof want, "rank-001.bin: chunk %zu (bytes %llu..%llu) failed its "
		 "checksum; it holds tensor 'big'", ci, (unsigned long long)jint(c, "offset"),
		 (unsigned long long)(jint(c, "offset") + jint(c, "size")));
	struct snap_open_opts map = {.verify = true, .map = 1};
	open_fails(out, &map, WK_EFORMAT, want);
	map.verify = false;
	struct snap *s = open_ok(out, &map);
	const struct st_tensor *t = snap_tensor(s, 1, "big");
	uint64_t at = jint(c, "offset") + 5 - t->offset;
	cr_assert_eq(((const unsigned char *)t->data)[at], fixture[5].data[at] ^ 0x40);
	snap_close(s);
	json_decref(m);
	free(rf);
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot, flipped_byte_lz4_chunk)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap"), *rf = path2(out, "rank-000.bin");
	write_snap(out, true);
	json_t *m = load_manifest(out);
	size_t ci = chunk_inside(m, 0, "big");
	json_t *c = chunk_of(m, 0, ci);
	cr_assert(json_is_true(json_object_get(c, "lz4")));
	flip(rf, jint(c, "file_offset") + jint(c, "stored") / 2);
	char want[64];
	snprintf(want, sizeof want, "chunk %zu (bytes", ci);
	open_fails(out, NULL, WK_EFORMAT, want);
	open_fails(out, NULL, WK_EFORMAT, "it holds tensor 'big'");
	json_decref(m);
	free(rf);
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot, chunk_spanning_tensors_names_them)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap"), *rf = path2(out, "rank-000.bin");
	write_snap(out, false);
	json_t *m = load_manifest(out);
	/* "scale", "odd" and "empty" sit in consecutive 4 KiB pages: one 8 KiB chunk holds two. */
	json_t *t = tensor_of(m, 0, "scale");
	size_t ci = (size_t)(jint(t, "offset") / CHUNK);
	flip(rf, jint(chunk_of(m, 0, ci), "file_offset"));
	open_fails(out, NULL, WK_EFORMAT, "it holds tensors ");
	json_decref(m);
	free(rf);
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot, truncated_missing_and_bad_header)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap"), *rf = path2(out, "rank-001.bin");
	write_snap(out, true);
	struct stat st;
	cr_assert_eq(stat(rf, &st), 0);
	char want[128];
	flip(rf, 1);
	open_fails(out, NULL, WK_EFORMAT, "bad magic");
	flip(rf, 1);
	flip(rf, 12); /* the rank field */
	open_fails(out, NULL, WK_EFORMAT, "header block does not match");
	flip(rf, 12);
	cr_assert_eq(truncate(rf, st.st_size + 1), 0);
	open_fails(out, NULL, WK_EFORMAT, "the manifest says");
	cr_assert_eq(truncate(rf, st.st_size), 0);
	struct snap *s = open_ok(out, NULL);
	snap_close(s);
	cr_assert_eq(truncate(rf, st.st_size - 4096), 0);
	snprintf(want, sizeof want, "rank-001.bin: truncated: %lld bytes, the manifest says %lld",
		 (long long)st.st_size - 4096, (long long)st.st_size);
	open_fails(out, NULL, WK_EFORMAT, want);
	cr_assert_eq(unlink(rf), 0);
	open_fails(out, NULL, WK_ENOTFOUND, "rank-001.bin: missing");
	open_fails(d, NULL, WK_ENOTFOUND, "not a snapshot");
	free(rf);
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot, other_version)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	write_snap(out, false);
	json_t *m = load_manifest(out);
	json_object_set_new(m, "version", json_integer(3));
	json_object_del(m, "ranks"); /* a v3 manifest may look different: still the version msg */
	save_manifest(out, m);
	open_fails(out, NULL, WK_EUNSUPPORTED, "snapshot format version 3, this wick reads "
		   "versions 1 to 2");
	json_decref(m);
	rmtree(d);
	free(out);
	free_fixture();
}

/* Rewrites rank r's header block as version v with meaning hash 0 (version 1's layout). */
static void header_v(const char *out, int r, uint32_t v)
{
	char name[32];
	snprintf(name, sizeof name, "rank-%03d.bin", r);
	char *rf = path2(out, name);
	FILE *f = fopen(rf, "r+b");
	cr_assert_not_null(f, "%s", rf);
	unsigned char le[4] = {v, v >> 8, v >> 16, v >> 24}, zero[8] = {0};
	cr_assert(fseek(f, 8, SEEK_SET) == 0 && fwrite(le, 4, 1, f) == 1);
	cr_assert(fseek(f, 48, SEEK_SET) == 0 && fwrite(zero, 8, 1, f) == 1);
	cr_assert(fclose(f) == 0);
	free(rf);
}

/* A manifest edited where the structural checks cannot see it (a tensor's dtype or shape, two
 * names swapped, the model's config) no longer matches the meaning hash its rank file was
 * written with; a version-1 snapshot (no meaning hash) still opens. */
Test(snapshot, edited_manifest_meaning)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	write_snap(out, false);
	json_t *orig = load_manifest(out);
	cr_assert_eq(jint(orig, "version"), 2);
	for (int k = 0; k < 5; k++) {
		json_t *m = json_deep_copy(orig);
		const char *want = "rank 0's tensor table or the model's config is not what "
				   "rank-000.bin was written with";
		if (k == 0) { /* bf16 read as f16: the same bytes, another model */
			json_object_set_new(tensor_of(m, 0, "big"), "dtype", json_string("F16"));
		} else if (k == 1) { /* [300, 200] read as [200, 300] */
			json_t *sh = json_object_get(tensor_of(m, 0, "big"), "shape");
			json_array_set_new(sh, 0, json_integer(200));
			json_array_set_new(sh, 1, json_integer(300));
		} else if (k == 2) { /* two names swapped on rank 1 */
			json_object_set_new(tensor_of(m, 1, "zeros"), "name", json_string("tmp"));
			json_object_set_new(tensor_of(m, 1, "norm"), "name", json_string("zeros"));
			json_object_set_new(tensor_of(m, 1, "tmp"), "name", json_string("norm"));
			want = "rank 1's tensor table";
		} else if (k == 3) {
			json_object_set_new(json_object_get(m, "config"), "hidden_size",
					    json_integer(4096));
		} else {
			json_object_set_new(m, "layout", json_pack("{si}", "version", 9));
		}
		save_manifest(out, m);
		json_decref(m);
		open_fails(out, NULL, WK_EFORMAT, want);
	}
	/* the header from version 1 under a version-2 manifest */
	save_manifest(out, orig);
	header_v(out, 0, 1);
	open_fails(out, NULL, WK_EFORMAT, "rank-000.bin: snapshot format version 1, the "
		   "manifest's is 2");
	/* a whole version-1 snapshot opens, restores, and is not checked for meaning */
	header_v(out, 1, 1);
	json_t *m = json_deep_copy(orig);
	json_object_set_new(m, "version", json_integer(1));
	save_manifest(out, m);
	struct snap *s = open_ok(out, NULL);
	check_restored(s);
	snap_close(s);
	json_object_set_new(json_object_get(m, "config"), "hidden_size", json_integer(4096));
	save_manifest(out, m);
	snap_close(open_ok(out, NULL));
	json_decref(m);
	json_decref(orig);
	rmtree(d);
	free(out);
	free_fixture();
}

/* The meaning hash is of the values, not of a JSON library's text: the manifest rewritten
 * with reals printed shortest (1e-05, where jansson 2.14 writes 1.0000000000000001e-05) and
 * its keys reordered still opens; a real changed by one ulp does not. */
Test(snapshot, meaning_hash_is_of_values)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap"), err[WK_ERRSZ] = "";
	json_t *cfg = json_pack("{si sf sf s{si s[fi]}}", "hidden_size", 8, "rms_norm_eps", 1e-5,
				"rope_theta", 10000.0, "nested", "b", 1, "a", 0.1, 2);
	struct snap_write_opts o = {.world = 2, .tp = 2, .ep = 1, .dtype = "keep",
				    .chunk_size = CHUNK, .config = cfg};
	cr_assert_eq(snap_write(out, &o, specs, NFIX, err, sizeof err), WK_OK, "%s", err);
	json_t *m = load_manifest(out);
	char *mp = path2(out, "manifest.json");
	cr_assert_eq(json_dump_file(m, mp, JSON_REAL_PRECISION(6) | JSON_SORT_KEYS), 0);
	char *text;
	size_t len;
	cr_assert_eq(wk_read_file(mp, 1 << 20, &text, &len, err, sizeof err), WK_OK, "%s", err);
	cr_assert(strstr(text, "\"rms_norm_eps\": 1e-") && !strstr(text, "0000000000000001"),
		  "%.300s", text); /* the writer's "%.17g": 1.0000000000000001e-05 */
	free(text);
	snap_close(open_ok(out, NULL));
	json_t *c = json_object_get(m, "config");
	json_object_set_new(c, "rms_norm_eps", json_real(nextafter(1e-5, 1.0)));
	save_manifest(out, m);
	open_fails(out, NULL, WK_EFORMAT, "the model's config is not what");
	json_decref(m);
	json_decref(cfg);
	free(mp);
	rmtree(d);
	free(out);
	free_fixture();
}

/* Each mutation of a valid manifest must be refused with a message containing want. */
struct mutation {
	const char *path; /* "ranks.0.tensors.1.offset" style; NULL: replace the whole text */
	json_t *(*value)(json_t *m);
	const char *want;
};

static json_t *v_big(json_t *m) { (void)m; return json_integer(1ll << 40); }
static json_t *v_str(json_t *m) { (void)m; return json_string("2"); }
static json_t *v_f99(json_t *m) { (void)m; return json_string("F99"); }
static json_t *v_badhex(json_t *m) { (void)m; return json_string("xyz"); }
static json_t *v_dotdot(json_t *m) { (void)m; return json_string("../etc"); }
static json_t *v_del(json_t *m) { (void)m; return NULL; }
static json_t *v_zero(json_t *m) { (void)m; return json_integer(0); }
static json_t *v_true(json_t *m) { (void)m; return json_true(); }
static json_t *v_image(json_t *m)
{
	return json_integer((json_int_t)jint(json_array_get(json_object_get(m, "ranks"), 0),
					     "image_size"));
}
static json_t *v_embed_off(json_t *m)
{
	return json_integer((json_int_t)jint(tensor_of(m, 0, "embed"), "offset"));
}

static json_t *walk(json_t *m, const char *path, char *last)
{
	char buf[128];
	snprintf(buf, sizeof buf, "%s", path);
	char *save, *tok = strtok_r(buf, ".", &save), *next;
	json_t *cur = m;
	while ((next = strtok_r(NULL, ".", &save))) {
		cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok))
					 : json_object_get(cur, tok);
		tok = next;
	}
	snprintf(last, 64, "%s", tok);
	return cur;
}

Test(snapshot, malformed_manifests)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap"), *mp = path2(out, "manifest.json");
	write_snap(out, true);
	json_t *orig = load_manifest(out);
	int scale_idx = 2;
	const struct mutation cases[] = {
		{"ranks", v_del, "missing \"ranks\""},
		{"config", v_del, "\"config\" is missing"},
		{"world", v_str, "world is not a non-negative integer"},
		{"world", v_zero, "world is 0"},
		{"chunk_size", v_zero, "chunk_size 0"},
		{"ranks.0.chunks.1.file_offset", v_big, "ranks[0].chunks[1].file_offset"},
		{"ranks.0.chunks.1.offset", v_zero, "chunks must tile the image"},
		{"ranks.0.chunks.0.stored", v_zero, "raw but stores"},
		{"ranks.0.chunks.0.xxh3", v_badhex, "not 16 lowercase hex digits"},
		{"ranks.0.chunks.0.lz4", v_del, "missing \"ranks[0].chunks[0].lz4\""},
		{"ranks.0.xxh3", v_badhex, "ranks[0].xxh3"},
		{"ranks.0.file", v_dotdot, "expected \"rank-000.bin\""},
		{"ranks.0.size", v_zero, "ranks[0].size is 0"},
		{"ranks.0.tensors.0.offset", v_image, "lie outside"},
		{"ranks.0.tensors.0.dtype", v_f99, "unknown dtype"},
		{"ranks.0.tensors.0.nbytes", v_zero, "does not match its shape"},
		{"ranks.0.tensors.0.shape", v_true, "shape is not an array"},
		{"compress", v_f99, "expected \"none\" or \"lz4\""},
	};
	char want_ov[64];
	snprintf(want_ov, sizeof want_ov, "overlap");
	for (size_t k = 0; k < sizeof cases / sizeof cases[0] + 3; k++) {
		json_t *m = json_deep_copy(orig);
		const char *want;
		if (k < sizeof cases / sizeof cases[0]) {
			char last[64];
			json_t *parent = walk(m, cases[k].path, last);
			cr_assert_not_null(parent, "%s", cases[k].path);
			json_t *v = cases[k].value(m);
			if (json_is_array(parent))
				json_array_set_new(parent, (size_t)atoi(last), v);
			else if (v)
				json_object_set_new(parent, last, v);
			else
				json_object_del(parent, last);
			want = cases[k].want;
		} else if (k == sizeof cases / sizeof cases[0]) {
			/* "scale" moved onto "embed": the image end is unchanged ("odd" is last). */
			json_t *ts = json_object_get(json_array_get(json_object_get(m, "ranks"), 0),
						     "tensors");
			json_object_set_new(json_array_get(ts, (size_t)scale_idx), "offset",
					    v_embed_off(m));
			want = want_ov;
		} else if (k == sizeof cases / sizeof cases[0] + 1) {
			json_t *cs = json_object_get(json_array_get(json_object_get(m, "ranks"), 1),
						     "chunks");
			json_array_remove(cs, json_array_size(cs) - 1);
			want = "chunks; a";
		} else {
			json_decref(m);
			m = NULL;
			FILE *f = fopen(mp, "w");
			fputs("{\"format\": \"wick-snapshot\", \"version\": 1,", f);
			fclose(f);
			want = "not valid JSON";
		}
		if (m) {
			save_manifest(out, m);
			json_decref(m);
		}
		open_fails(out, NULL, 0, want);
		char err[WK_ERRSZ];
		cr_assert_neq(snap_prefetch(out, 1, err, sizeof err), WK_OK);
	}
	save_manifest(out, orig);
	struct snap *s = open_ok(out, NULL);
	check_restored(s);
	snap_close(s);
	json_decref(orig);
	free(mp);
	rmtree(d);
	free(out);
	free_fixture();
}

/* ---- writing: refusals, failures, replacement, source ------------------------------------- */

Test(snapshot, interrupted_write_leaves_nothing)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	char err[WK_ERRSZ] = "";
	struct snap_write_opts o = {.world = 2, .lz4 = true, .chunk_size = CHUNK};
	fail_at = 3;
	int rc = snap_write(out, &o, specs, NFIX, err, sizeof err);
	cr_assert_eq(rc, WK_EIO, "%s", err);
	cr_assert(strstr(err, "tensor 'odd': simulated failure"), "%s", err);
	cr_assert_eq(entries(d), 0, "no out_dir and no tmp dir");

	/* With an existing snapshot, a failed write leaves the old one intact. */
	fail_at = -1;
	write_snap(out, true);
	fail_at = 3;
	cr_assert_neq(snap_write(out, &o, specs, NFIX, err, sizeof err), WK_OK);
	cr_assert_eq(entries(d), 1);
	fail_at = -1;
	struct snap *s = open_ok(out, NULL);
	check_restored(s);
	snap_close(s);
	rmtree(d);
	free(out);
	free_fixture();
}
