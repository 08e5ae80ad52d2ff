/*
 * test_snapshot_sink.c - restoring a snapshot through a sink (snapshot.h: struct snap_sink),
 * the path that streams a snapshot into a GPU's memory through pinned staging buffers.
 *
 * The sink here stands in for a GPU as strictly as a CPU can: each image is a memfd mapped
 * twice, PROT_NONE at the address the restore is given (any read or write of it by the
 * restore crashes the test) and read-write at an alias only the sink uses; and a copy is
 * made only when the restore waits for its staging buffer, so a restore that refilled a
 * buffer before waiting, or returned without waiting, would leave wrong or missing bytes.
 */
#include <pthread.h>
#include <sys/mman.h>

#include "tests/unit/snapshot_fixture.h"

#define MAX_STAGES 64

struct dimage {
	void *none, *rw; /* the same pages twice */
	size_t len;
};

struct fake {
	pthread_mutex_t mu;
	bool accept;
	bool fail_image, fail_stage;
	struct dimage img[SNAP_MAX_RANKS];
	int n_images, n_released;
	struct {
		void *buf;
		unsigned char *dst; /* pending copy into an rw alias, or NULL */
		size_t bytes;
	} st[MAX_STAGES];
	int n_st, stage_allocs, peak_st;
	size_t max_stage; /* the largest staging buffer asked for */
	int puts, waits;
	bool refilled; /* a put on a buffer whose copy was not waited for */
	bool freed_pending;
};

static unsigned char *alias(struct fake *f, const void *dev, size_t bytes)
{
	for (int r = 0; r < SNAP_MAX_RANKS; r++) {
		struct dimage *im = &f->img[r];
		if (im->none && (const char *)dev >= (const char *)im->none &&
		    (const char *)dev + bytes <= (const char *)im->none + im->len)
			return (unsigned char *)im->rw + ((const char *)dev - (const char *)im->none);
	}
	return NULL;
}

static bool f_accept(void *ctx, int world)
{
	(void)world;
	return ((struct fake *)ctx)->accept;
}

static void *f_image(void *ctx, int rank, size_t size)
{
	struct fake *f = ctx;
	if (f->fail_image)
		return NULL;
	int fd = memfd_create("devimage", 0);
	cr_assert(fd >= 0);
	cr_assert_eq(ftruncate(fd, (off_t)size), 0);
	void *none = mmap(NULL, size, PROT_NONE, MAP_SHARED, fd, 0);
	void *rw = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	cr_assert(none != MAP_FAILED && rw != MAP_FAILED);
	cr_assert_null(f->img[rank].none, "rank %d given two images", rank);
	f->img[rank] = (struct dimage){none, rw, size};
	f->n_images++;
	return none;
}

static void f_release(void *ctx, int rank, void *image)
{
	struct fake *f = ctx;
	cr_assert_eq(f->img[rank].none, image);
	munmap(f->img[rank].none, f->img[rank].len);
	munmap(f->img[rank].rw, f->img[rank].len);
	f->img[rank] = (struct dimage){0};
	f->n_released++;
}

static void *f_stage_alloc(void *ctx, size_t size)
{
	struct fake *f = ctx;
	if (f->fail_stage)
		return NULL;
	void *p = aligned_alloc(SNAP_ALIGN, (size + SNAP_ALIGN - 1) / SNAP_ALIGN * SNAP_ALIGN);
	pthread_mutex_lock(&f->mu);
	cr_assert_lt(f->n_st, MAX_STAGES);
	if (size > f->max_stage)
		f->max_stage = size;
	f->st[f->n_st].buf = p;
	f->st[f->n_st].dst = NULL;
	f->n_st++;
	f->stage_allocs++;
	if (f->n_st > f->peak_st)
		f->peak_st = f->n_st;
	pthread_mutex_unlock(&f->mu);
	return p;
}

static int stage_index(struct fake *f, const void *buf) /* under mu */
{
	for (int i = 0; i < f->n_st; i++)
		if (f->st[i].buf == buf)
			return i;
	cr_assert_fail("%p is not a staging buffer", buf);
	return -1;
}

static void f_stage_free(void *ctx, void *buf)
{
	struct fake *f = ctx;
	pthread_mutex_lock(&f->mu);
	int i = stage_index(f, buf);
	f->freed_pending |= f->st[i].dst != NULL;
	f->st[i] = f->st[--f->n_st];
	pthread_mutex_unlock(&f->mu);
	free(buf);
}

static int f_put(void *ctx, int rank, void *dst, const void *buf, size_t bytes, char *err,
		 size_t errsz)
{
	struct fake *f = ctx;
	pthread_mutex_lock(&f->mu);
	unsigned char *a = alias(f, dst, bytes);
	cr_assert_not_null(a, "put to %p (%zu bytes) is outside every image", dst, bytes);
	cr_assert_eq(a - (unsigned char *)f->img[rank].rw < (ptrdiff_t)f->img[rank].len, 1,
		     "put for rank %d lands in another rank's image", rank);
	int i = stage_index(f, buf);
	f->refilled |= f->st[i].dst != NULL;
	f->st[i].dst = a;
	f->st[i].bytes = bytes;
	f->puts++;
	pthread_mutex_unlock(&f->mu);
	(void)err;
	(void)errsz;
	return WK_OK;
}

static int f_wait(void *ctx, const void *buf, char *err, size_t errsz)
{
	struct fake *f = ctx;
	pthread_mutex_lock(&f->mu);
	int i = stage_index(f, buf);
	if (f->st[i].dst)
		memcpy(f->st[i].dst, f->st[i].buf, f->st[i].bytes); /* the copy happens now */
	f->st[i].dst = NULL;
	f->waits++;
	pthread_mutex_unlock(&f->mu);
	(void)err;
	(void)errsz;
	return WK_OK;
}

static struct snap_sink sink_of(struct fake *f)
{
	pthread_mutex_init(&f->mu, NULL);
	return (struct snap_sink){f_accept, f_image, f_release, f_stage_alloc, f_stage_free,
				  f_put, f_wait, f};
}

/* Every tensor of the fixture, read back through the sink's aliases. */
static void check_device(struct snap *s, struct fake *f)
{
	cr_assert(snap_on_sink(s));
	for (size_t i = 0; i < NFIX; i++) {
		const struct src *x = &fixture[i];
		const struct st_tensor *t = snap_tensor(s, x->rank_file, x->name);
		cr_assert_not_null(t, "%s missing", x->name);
		cr_assert_eq(t->nbytes, x->nbytes);
		if (!x->nbytes)
			continue;
		const unsigned char *a = alias(f, t->data, t->nbytes);
		cr_assert_not_null(a, "%s does not point into a device image", x->name);
		cr_assert(!memcmp(a, x->data, x->nbytes), "%s differs on the device", x->name);
	}
}

static void restore_through_sink(bool lz4)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	write_snap(out, lz4);
	/* pieces: of a chunk (4096), across chunk ends (12288, 20480), the default */
	struct {
		int threads;
		size_t read_size, piece;
	} runs[] = {{1, 4096, 4096},	       {3, 0, 0},	   {7, 3 * CHUNK + 1, 12288},
		    {2, 2 * CHUNK, 0},	       {4, 0, 4096},	   {3, 4 * CHUNK, 20480}};
	for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
		struct fake f = {.accept = true};
		struct snap_sink sk = sink_of(&f);
		struct snap_open_opts o = {.verify = true, .sink = &sk, .threads = runs[k].threads,
					   .read_size = runs[k].read_size,
					   .sink_piece = runs[k].piece, .map = 1};
		struct snap *s = open_ok(out, &o);
		check_device(s, &f);
		const struct snap_timings *tm = snap_timings(s);
		cr_assert_eq(tm->bytes_mapped, 0, "a sink's images are never a mapping");
		cr_assert_eq(tm->bytes_direct + tm->bytes_buffered, tm->bytes_read);
		cr_assert_eq(f.n_images, 2);
		if (runs[k].read_size)
			cr_assert_gt(f.puts, 4, "run %zu: the images came in pieces", k);
		cr_assert(!f.refilled, "run %zu: a buffer was refilled before its copy finished", k);
		cr_assert(!f.freed_pending, "run %zu: a buffer was freed before its copy", k);
		cr_assert_eq(f.n_st, 0, "run %zu: every staging buffer is freed", k);
		int most = (SNAP_SINK_SLOTS + (lz4 ? 2 : 0)) * tm->threads;
		cr_assert_leq(f.stage_allocs, most, "run %zu: %d buffers, at most %d", k,
			      f.stage_allocs, most);
		if (!lz4) /* raw chunks: pieces, never a whole item */
			cr_assert_leq(f.max_stage, runs[k].piece ? runs[k].piece : SNAP_SINK_PIECE,
				      "run %zu: a staging buffer of %zu bytes", k, f.max_stage);
		uint64_t a;
		cr_assert_eq(snap_image(s, 0, &a), f.img[0].none);
		snap_close(s);
		cr_assert_eq(f.n_released, 2);
		pthread_mutex_destroy(&f.mu);
	}
	rmtree(d);
	free(out);
	free_fixture();
}

Test(snapshot_sink, raw_chunks_stream_into_the_sink)
{
	restore_through_sink(false);
}

Test(snapshot_sink, lz4_chunks_stream_into_the_sink)
{
	restore_through_sink(true);
}

/* accept() false: restored into host memory as without a sink, and the sink is not used. */
Test(snapshot_sink, declined)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	write_snap(out, true);
	struct fake f = {.accept = false};
	struct snap_sink sk = sink_of(&f);
	struct snap_open_opts o = {.verify = true, .sink = &sk};
	struct snap *s = open_ok(out, &o);
	cr_assert(!snap_on_sink(s));
	check_restored(s);
	cr_assert_eq(f.n_images + f.stage_allocs + f.puts, 0);
	snap_close(s);
	pthread_mutex_destroy(&f.mu);
	rmtree(d);
	free(out);
	free_fixture();
}

/* A chunk that fails its checksum (raw, then lz4) fails the restore by name, and everything
 * the sink handed out is given back, after every copy in flight was waited for. Raw chunks
 * go in pieces: the bad byte in a chunk's first piece, in its second (the first already
 * copied), and in a piece that spans chunks. */
Test(snapshot_sink, bad_chunk_fails_and_releases)
{
	make_fixture();
	struct {
		int lz4;
		long at;
		size_t read_size, piece;
	} cases[] = {{0, 10, 4096, 0}, {0, 4096 + 10, 4096, 4096}, {0, 10, 0, 3 * 4096},
		     {1, 10, 4096, 0}};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		int lz4 = cases[k].lz4;
		char *d = tmpdir(), *out = path2(d, "snap"), *rf = path2(out, "rank-001.bin");
		write_snap(out, lz4);
		json_t *m = load_manifest(out);
		json_t *c = chunk_of(m, 1, chunk_inside(m, 1, lz4 ? "zeros" : "big"));
		cr_assert_gt((long)jint(c, "size"), cases[k].at, "case %zu: the chunk is too small", k);
		flip(rf, jint(c, "file_offset") + cases[k].at);
		struct fake f = {.accept = true};
		struct snap_sink sk = sink_of(&f);
		struct snap_open_opts o = {.verify = true, .sink = &sk, .threads = 3,
					   .read_size = cases[k].read_size,
					   .sink_piece = cases[k].piece};
		open_fails(out, &o, WK_EFORMAT, lz4 ? "rank-001.bin: chunk" : "failed its checksum");
		cr_assert_eq(f.n_released, f.n_images);
		cr_assert_eq(f.n_st, 0);
		cr_assert(!f.freed_pending && !f.refilled);
		pthread_mutex_destroy(&f.mu);
		json_decref(m);
		free(rf);
		rmtree(d);
		free(out);
	}
	free_fixture();
}

static void *no_alloc(void *ctx, int rank, size_t size)
{
	(void)ctx;
	(void)rank;
	(void)size;
	return NULL;
}

static void no_release(void *ctx, int rank, void *p, size_t size)
{
	(void)ctx;
	(void)rank;
	(void)p;
	(void)size;
}

Test(snapshot_sink, refusals)
{
	make_fixture();
	char *d = tmpdir(), *out = path2(d, "snap");
	write_snap(out, false);
	struct fake f = {.accept = true};
	struct snap_sink sk = sink_of(&f);

	struct snap_sink half = sk;
	half.wait = NULL;
	struct snap_open_opts o = {.verify = true, .sink = &half};
	open_fails(out, &o, WK_EINVAL, "a sink without");

	struct snap_allocator al = {no_alloc, no_release, NULL};
	struct snap_open_opts both = {.verify = true, .sink = &sk, .allocator = &al};
	open_fails(out, &both, WK_EINVAL, "both a sink and an allocator");

	f.fail_image = true;
	struct snap_open_opts oi = {.verify = true, .sink = &sk};
	open_fails(out, &oi, WK_ENOMEM, "in the sink's memory");
	f.fail_image = false;

	f.fail_stage = true;
	open_fails(out, &oi, WK_ENOMEM, "staging buffer");
	cr_assert_eq(f.n_released, f.n_images);
	pthread_mutex_destroy(&f.mu);
	rmtree(d);
	free(out);
	free_fixture();
}
