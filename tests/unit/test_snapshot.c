/*
 * test_snapshot.c - snapshots round-trip bit for bit across rank files, with and without lz4,
 * copied or mapped, read with O_DIRECT or from the page cache; snap_write refuses bad input,
 * replaces an old snapshot atomically and records the source's identity.
 * Corruption and interrupted writes are in test_snapshot_corrupt.c.
 *
 * Each test works in its own mkdtemp directory under /tmp and removes it. Chunks are small
 * (8 KiB) so that a handful of tensors spans many chunks and many work items.
 */
#include "tests/unit/snapshot_fixture.h"

/* ---- round trips -------------------------------------------------------------------------- */

Test(snapshot, round_trip_lz4)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	write_snap(out, true);
	cr_assert(snap_is_snapshot(out));
	cr_assert_eq(entries(d), 1, "only the snapshot is left in the parent");

	json_t *m = load_manifest(out);
	cr_assert_str_eq(json_string_value(json_object_get(m, "format")), SNAP_FORMAT);
	cr_assert_eq(jint(m, "version"), SNAP_VERSION);
	cr_assert_eq(jint(m, "world"), 2);
	cr_assert_eq(jint(m, "tp"), 2);
	cr_assert_eq(jint(m, "chunk_size"), CHUNK);
	cr_assert_str_eq(json_string_value(json_object_get(m, "compress")), "lz4");
	cr_assert(json_is_null(json_object_get(m, "source")));
	for (int r = 0; r < 2; r++) {
		json_t *rk = json_array_get(json_object_get(m, "ranks"), (size_t)r), *c;
		char name[32];
		snprintf(name, sizeof name, "rank-%03d.bin", r);
		cr_assert_str_eq(json_string_value(json_object_get(rk, "file")), name);
		char *p = path2(out, name);
		struct stat st;
		cr_assert_eq(stat(p, &st), 0);
		cr_assert_eq((uint64_t)st.st_size, jint(rk, "size"));
		free(p);
		size_t i;
		uint64_t img = 0;
		json_array_foreach(json_object_get(rk, "chunks"), i, c) {
			cr_assert_eq(jint(c, "file_offset") % SNAP_ALIGN, 0);
			cr_assert_eq(jint(c, "offset"), img);
			img += jint(c, "size");
			if (!json_is_true(json_object_get(c, "lz4")))
				cr_assert_eq(jint(c, "stored"), jint(c, "size"));
		}
		cr_assert_eq(img, jint(rk, "image_size"));
		cr_assert_gt(json_array_size(json_object_get(rk, "chunks")), 3);
	}
	/* Random bytes stay raw, compressible bytes are stored lz4. */
	cr_assert(json_is_false(json_object_get(chunk_of(m, 0, chunk_inside(m, 0, "embed")), "lz4")));
	cr_assert(json_is_true(json_object_get(chunk_of(m, 0, chunk_inside(m, 0, "big")), "lz4")));
	cr_assert(json_is_false(json_object_get(chunk_of(m, 1, chunk_inside(m, 1, "big")), "lz4")));
	cr_assert(json_is_true(json_object_get(chunk_of(m, 1, chunk_inside(m, 1, "zeros")), "lz4")));
	json_decref(m);

	struct snap *s = open_ok(out, NULL);
	check_restored(s);
	const struct snap_timings *tm = snap_timings(s);
	uint64_t a, b;
	cr_assert_not_null(snap_image(s, 0, &a));
	cr_assert_not_null(snap_image(s, 1, &b));
	cr_assert_eq(tm->bytes_restored, a + b);
	cr_assert_eq(tm->bytes_direct + tm->bytes_buffered + tm->bytes_mapped, tm->bytes_read);
	cr_assert_gt(tm->decompress_s + tm->verify_s, 0);
	snap_close(s);

	/* Other thread counts and read sizes restore the same bytes. */
	struct snap_open_opts o1 = {.verify = true, .threads = 1, .read_size = 4096};
	s = open_ok(out, &o1);
	check_restored(s);
	snap_close(s);
	struct snap_open_opts o2 = {.verify = true, .threads = 7, .read_size = 3 * CHUNK + 1};
	s = open_ok(out, &o2);
	check_restored(s);
	snap_close(s);
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot, round_trip_raw)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	write_snap(out, false);
	json_t *m = load_manifest(out), *c;
	cr_assert_str_eq(json_string_value(json_object_get(m, "compress")), "none");
	for (int r = 0; r < 2; r++)
		for (size_t i = 0; (c = chunk_of(m, r, i)); i++) {
			cr_assert(json_is_false(json_object_get(c, "lz4")));
			cr_assert_eq(jint(c, "stored"), jint(c, "size"));
		}
	json_decref(m);
	/* All chunks raw: the image can be a mapping of the (cached) file, or a copy. */
	struct snap *s = open_ok(out, NULL);
	check_restored(s);
	cr_assert_eq(snap_timings(s)->bytes_mapped, snap_timings(s)->bytes_read);
	snap_close(s);
	struct snap_open_opts copy = {.verify = true, .map = -1};
	s = open_ok(out, &copy);
	check_restored(s);
	cr_assert_eq(snap_timings(s)->bytes_mapped, 0);
	snap_close(s);
	struct snap_open_opts map = {.verify = true, .map = 1, .threads = 3, .read_size = 3 * CHUNK};
	s = open_ok(out, &map);
	check_restored(s);
	cr_assert_eq(snap_timings(s)->bytes_mapped, snap_timings(s)->bytes_read);
	snap_close(s);
	rmtree(d);
	free(out);
	free_fixture();
}

/* A tensor larger than the default chunk, read with O_DIRECT once the cache is dropped, then
 * buffered once prefetch has warmed the cache. */
Test(snapshot, direct_and_prefetch)
{
	char *d = tmpdir(), *out = path2(d, "snap");
	struct src big = {"w", 0, DT_F32, 1, {5 << 20}, 1, NULL, 0};
	big.nbytes = 4ull * (5 << 20);
	big.data = malloc(big.nbytes);
	fill_random(big.data, big.nbytes, 7);
	struct snap_spec t = {.name = "w", .dtype = DT_F32, .rank = 1, .shape = {5 << 20},
			      .nbytes = big.nbytes, .produce = produce, .ctx = &big,
			      .layout = "rows"};
	struct snap_write_opts o = {.world = 1, .lz4 = true};
	char err[WK_ERRSZ] = "";
	fail_at = -1;
	cr_assert_eq(snap_write(out, &o, &t, 1, err, sizeof err), WK_OK, "%s", err);

	char *rf = path2(out, "rank-000.bin");
	int fd = open(rf, O_RDONLY);
	cr_assert(fd >= 0);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	fd = open(rf, O_RDONLY | O_DIRECT);
	bool direct = fd >= 0;
	if (fd >= 0)
		close(fd);
	struct snap *s = open_ok(out, NULL);
	const struct st_tensor *w = snap_tensor(s, 0, "w");
	cr_assert(!memcmp(w->data, big.data, big.nbytes));
	cr_assert_str_eq(snap_tensor_layout(s, 0, 0), "rows");
	const struct snap_timings *tm = snap_timings(s);
	cr_assert_eq(tm->bytes_direct + tm->bytes_buffered + tm->bytes_mapped, tm->bytes_read);
	if (direct)
		cr_assert_gt(tm->bytes_direct, 0, "a dropped cache should be read with O_DIRECT");
	snap_close(s);

	uint64_t want = 0;
	struct snap_prefetch_stats ps;
	cr_assert_eq(snap_prefetch_stats(out, 3, &ps, err, sizeof err), WK_OK, "%s", err);
	struct stat st;
	const char *names[] = {"manifest.json", "rank-000.bin"};
	for (size_t i = 0; i < 2; i++) {
		char *p = path2(out, names[i]);
		cr_assert_eq(stat(p, &st), 0);
		want += (uint64_t)st.st_size;
		free(p);
	}
	cr_assert_eq(ps.bytes, want);
	cr_assert_eq(ps.files, 2);
	cr_assert_gt(ps.bytes_read, big.nbytes / 2, "the dropped rank file is read");
	cr_assert_eq(snap_prefetch_stats(out, 3, &ps, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(ps.bytes_read, 0, "a second prefetch finds everything cached");
	struct snap_open_opts copy = {.verify = true, .map = -1};
	s = open_ok(out, &copy);
	cr_assert_eq(snap_timings(s)->bytes_buffered, snap_timings(s)->bytes_read,
		     "a warm cache is read buffered");
	snap_close(s);
	s = open_ok(out, NULL);
	cr_assert_eq(snap_timings(s)->bytes_mapped, snap_timings(s)->bytes_read,
		     "a warm file of raw chunks is mapped");
	cr_assert(!memcmp(snap_tensor(s, 0, "w")->data, big.data, big.nbytes));
	snap_close(s);
	cr_assert_eq(snap_prefetch(d, 2, err, sizeof err), WK_ENOTFOUND);
	free(rf);
	free(big.data);
	rmtree(d);
	free(out);
}

static int n_alloc, n_release;

static void *t_alloc(void *ctx, int rank, size_t size)
{
	(void)ctx;
	(void)rank;
	n_alloc++;
	return aligned_alloc(SNAP_ALIGN, size);
}

static void t_release(void *ctx, int rank, void *p, size_t size)
{
	(void)ctx;
	(void)rank;
	(void)size;
	n_release++;
	free(p);
}

Test(snapshot, allocator_and_empty_rank)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	char err[WK_ERRSZ] = "";
	struct snap_write_opts o = {.world = 3, .chunk_size = CHUNK};
	cr_assert_eq(snap_write(out, &o, specs, NFIX, err, sizeof err), WK_OK, "%s", err);
	struct snap_allocator al = {t_alloc, t_release, NULL};
	struct snap_open_opts oo = {.verify = true, .allocator = &al};
	n_alloc = n_release = 0;
	struct snap *s = open_ok(out, &oo);
	cr_assert_eq(snap_world(s), 3);
	cr_assert_eq(snap_tensor_count(s, 2), 0);
	uint64_t sz = 1;
	cr_assert_null(snap_image(s, 2, &sz));
	cr_assert_eq(sz, 0);
	cr_assert(!memcmp(snap_tensor(s, 1, "big")->data, fixture[5].data, fixture[5].nbytes));
	cr_assert_eq(n_alloc, 2);
	snap_close(s);
	cr_assert_eq(n_release, 2);
	rmtree(d);
	free(out);
	free_fixture();
}

/* ---- writing: refusals, replacement, source ------------------------------------------------ */

static void write_fails(const char *out, const struct snap_write_opts *o,
			const struct snap_spec *t, size_t n, const char *want)
{
	char err[WK_ERRSZ] = "";
	int rc = snap_write(out, o, t, n, err, sizeof err);
	cr_assert_neq(rc, WK_OK, "expected a failure containing '%s'", want);
	cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
}

Test(snapshot, bad_input_refused)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	struct snap_write_opts o = {.world = 2, .chunk_size = CHUNK};
	o.world = 0;
	write_fails(out, &o, specs, NFIX, "world 0 is outside 1..64");
	o.world = 65;
	write_fails(out, &o, specs, NFIX, "world 65");
	o.world = 1;
	write_fails(out, &o, specs, NFIX, "rank_file 1 is outside 0..0");
	o.world = 2;
	o.chunk_size = 1000;
	write_fails(out, &o, specs, NFIX, "chunk_size 1000");
	o.chunk_size = CHUNK;
	struct snap_spec dup[2] = {specs[0], specs[0]};
	write_fails(out, &o, dup, 2, "tensor 'embed' appears twice in rank file 0");
	struct snap_spec bad = specs[0];
	bad.nbytes++;
	write_fails(out, &o, &bad, 1, "nbytes 14801 does not match");
	bad = specs[0];
	bad.dtype = DT_INVALID;
	write_fails(out, &o, &bad, 1, "bad dtype");
	const char *copy_bad[] = {"../x", NULL};
	o.copy = copy_bad;
	o.src_dir = d;
	write_fails(out, &o, specs, NFIX, "cannot copy '../x'");
	const char *copy_tok[] = {"tokenizer.json", NULL};
	struct snap_file made[2] = {{"tokenizer.json", "{}", 2}, {"x.bin", NULL, 1}};
	o.copy = copy_tok;
	o.made = made;
	o.n_made = 1;
	write_fails(out, &o, specs, NFIX, "made file 'tokenizer.json'"); /* copied as well */
	o.copy = NULL;
	made[0].name = "manifest.json";
	write_fails(out, &o, specs, NFIX, "made file 'manifest.json'");
	made[0].name = "rank-001.bin";
	write_fails(out, &o, specs, NFIX, "made file 'rank-001.bin'");
	made[0].name = "a/b";
	write_fails(out, &o, specs, NFIX, "made file 'a/b'");
	made[0].name = "x.bin";
	o.n_made = 2;
	write_fails(out, &o, specs, NFIX, "made file 'x.bin'"); /* twice, and no bytes */
	made[0].name = "ok.bin";
	write_fails(out, &o, specs, NFIX, "made file 'x.bin'"); /* no bytes */
	o.made = NULL;
	o.n_made = 0;
	o.copy = NULL;
	o.src_dir = NULL;
	cr_assert_eq(entries(d), 0, "refusals write nothing");

	/* A directory that is not a snapshot is never replaced. */
	cr_assert_eq(mkdir(out, 0755), 0);
	char *keep = path2(out, "precious.txt");
	FILE *f = fopen(keep, "w");
	fputs("x", f);
	fclose(f);
	write_fails(out, &o, specs, NFIX, "neither a snapshot nor an empty directory");
	cr_assert_eq(access(keep, F_OK), 0);
	cr_assert_eq(entries(d), 1);
	unlink(keep);
	free(keep);
	/* An empty one is. */
	write_snap(out, false);
	cr_assert(snap_is_snapshot(out));
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot, replace_and_stale_tmp)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap/"); /* a trailing slash names the same dir */
	write_snap(out, false);
	/* A .tmp dir of a dead process is removed; one of a live process (ours: pid 1) is not. */
	int dead = 4194000;
	while (kill(dead, 0) == 0 || errno != ESRCH)
		dead--;
	char stale[4096], live[4096];
	snprintf(stale, sizeof stale, "%s/snap.tmp-%d", d, dead);
	snprintf(live, sizeof live, "%s/snap.tmp-1", d);
	cr_assert_eq(mkdir(stale, 0755), 0);
	cr_assert_eq(mkdir(live, 0755), 0);
	fixture[0].data[0] ^= 1; /* the new snapshot differs */
	write_snap(out, true);
	cr_assert_eq(access(stale, F_OK), -1);
	cr_assert_eq(access(live, F_OK), 0);
	rmdir(live);
	cr_assert_eq(entries(d), 1, "old snapshot and tmp dirs are gone");
	struct snap *s = open_ok(out, NULL);
	check_restored(s);
	json_t *m = snap_manifest(s);
	cr_assert_str_eq(json_string_value(json_object_get(m, "compress")), "lz4");
	snap_close(s);
	rmtree(d);
	free(out);
	free_fixture();
}

static void put_file(const char *dir, const char *name, const void *buf, size_t n)
{
	char *p = path2(dir, name);
	FILE *f = fopen(p, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(buf, 1, n, f), n);
	fclose(f);
	free(p);
}

Test(snapshot, source_identity_and_copies)
{
	make_fixture();
	char *d = tmpdir(), *src = path2(d, "hf"), *out = path2(d, "snap");
	cr_assert_eq(mkdir(src, 0755), 0);
	size_t n = 3u << 20;
	unsigned char *w = malloc(n);
	fill_random(w, n, 3);
	put_file(src, "config.json", "{\"hidden_size\": 8}", 18);
	put_file(src, "model.safetensors", w, n);
	put_file(src, "tokenizer.json", "{\"model\": {}}", 13);
	put_file(src, "notes.txt", "not part of the identity", 24);
	const char *copy[] = {"tokenizer.json", "missing.json", NULL};
	char err[WK_ERRSZ] = "", *text;
	size_t len;
	struct snap_file made = {"made.bin", "\x01\x02\x00\x03", 4};
	struct snap_write_opts o = {.world = 2, .chunk_size = CHUNK, .src_dir = src,
				    .copy = copy, .made = &made, .n_made = 1};
	cr_assert_eq(snap_write(out, &o, specs, NFIX, err, sizeof err), WK_OK, "%s", err);
	char *mk = path2(out, "made.bin");
	cr_assert_eq(wk_read_file(mk, 1000, &text, &len, err, sizeof err), WK_OK, "%s", err);
	cr_assert(len == 4 && !memcmp(text, "\x01\x02\x00\x03", 4));
	free(text);
	free(mk);
	char *tok = path2(out, "tokenizer.json");
	cr_assert_eq(wk_read_file(tok, 1000, &text, &len, err, sizeof err), WK_OK);
	cr_assert_str_eq(text, "{\"model\": {}}");
	free(text);

	struct snap *s = open_ok(out, NULL);
	json_t *m = snap_manifest(s), *files = json_object_get(m, "files");
	cr_assert_eq(json_array_size(files), 2);
	json_t *f1 = json_array_get(files, 1);
	cr_assert_str_eq(json_string_value(json_object_get(f1, "name")), "made.bin");
	cr_assert_eq(json_integer_value(json_object_get(f1, "size")), 4);
	cr_assert(snap_lists_file(s, "made.bin"));
	json_t *f0 = json_array_get(files, 0);
	cr_assert_str_eq(json_string_value(json_object_get(f0, "name")), "tokenizer.json");
	cr_assert_eq(json_integer_value(json_object_get(f0, "size")), 13);
	cr_assert_str_eq(json_string_value(json_object_get(f0, "xxh3")), "598b79e4a58e2c70");
	cr_assert(snap_lists_file(s, "tokenizer.json") && !snap_lists_file(s, "missing.json"));
	json_t *sf = json_object_get(json_object_get(m, "source"), "files");
	cr_assert_eq(json_array_size(sf), 3);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(sf, 0), "name")),
			 "config.json");
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(sf, 1), "name")),
			 "model.safetensors");
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(sf, 1), "size")),
		     (json_int_t)n);
	cr_assert_eq(snap_source_check(s, src, err, sizeof err), WK_OK, "%s", err);

	/* Same size and mtime, one byte of the tail changed: the sample catches it. */
	char *mf = path2(src, "model.safetensors");
	struct stat st;
	cr_assert_eq(stat(mf, &st), 0);
	flip(mf, n - 10);
	struct timespec ts[2] = {st.st_atim, st.st_mtim};
	cr_assert_eq(utimensat(AT_FDCWD, mf, ts, 0), 0);
	cr_assert_eq(snap_source_check(s, src, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "model.safetensors has different contents"), "%s", err);
	flip(mf, n - 10);
	cr_assert_eq(utimensat(AT_FDCWD, mf, ts, 0), 0);
	cr_assert_eq(snap_source_check(s, src, err, sizeof err), WK_OK, "%s", err);
	/* Touched only. */
	ts[1].tv_sec += 5;
	cr_assert_eq(utimensat(AT_FDCWD, mf, ts, 0), 0);
	cr_assert_eq(snap_source_check(s, src, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "model.safetensors was modified"), "%s", err);
	ts[1].tv_sec -= 5;
	cr_assert_eq(utimensat(AT_FDCWD, mf, ts, 0), 0);
	/* A new shard. */
	put_file(src, "model-2.safetensors", "x", 1);
	cr_assert_eq(snap_source_check(s, src, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "model-2.safetensors is new"), "%s", err);
	snap_close(s);

	/* A copied file changed after the snapshot was written, then gone: refused by name, by
	 * a restore and by prefetch (the deploy gate). */
	put_file(out, "tokenizer.json", "{\"model\": []}", 13);
	open_fails(out, NULL, WK_EFORMAT, "tokenizer.json: changed after the snapshot was "
		   "written (13 bytes, xxh3 ");
	cr_assert_eq(snap_prefetch(out, 1, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, "tokenizer.json: changed after"), "%s", err);
	cr_assert_eq(unlink(tok), 0);
	open_fails(out, NULL, WK_ENOTFOUND, "tokenizer.json: missing, though the snapshot's "
		   "manifest lists it");
	put_file(out, "tokenizer.json", "{\"model\": {}}", 13);
	snap_close(open_ok(out, NULL));
	free(tok);

	/* Without src_dir the snapshot records no source. */
	struct snap_write_opts o2 = {.world = 2, .chunk_size = CHUNK};
	cr_assert_eq(snap_write(out, &o2, specs, NFIX, err, sizeof err), WK_OK, "%s", err);
	s = open_ok(out, NULL);
	cr_assert_eq(snap_source_check(s, src, err, sizeof err), WK_ENOTFOUND);
	snap_close(s);
	free(mf);
	free(w);
	free(src);
	rmtree(d);
	free(out);
	free_fixture();
}
