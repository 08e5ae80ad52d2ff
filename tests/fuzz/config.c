/* Fuzz target: config.json as `wick plan` reads it (plan_model_read), then the plan for a few
 * layouts (plan_compute), and the same bytes as a size string (plan_parse_size). No crash, no
 * sanitizer report; a plan that says the weights fit must not need more than the GPU has. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"
#include "worker/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[WK_ERRSZ];
	json_t *cfg = json_loadb((const char *)data, size, 0, NULL);
	struct plan_model m;
	if (cfg && json_is_object(cfg) && plan_model_read(cfg, &m, err, sizeof err) == WK_OK) {
		static const int layouts[][2] = {{1, 1}, {2, 2}, {8, 8}, {4, 8}, {8, 1}, {3, 3}};
		for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
			struct plan_opts o = {.tp = layouts[i][0], .ep = layouts[i][1],
					      .gpu_mem = 141000000000ull, .reserve = 4ull << 30,
					      .context = 4096, .batch = 512, .weights = PLAN_NDTYPE,
					      .kv = PLAN_BF16};
			struct plan_result r;
			if (plan_compute(&m, &o, &r, err, sizeof err) == WK_OK && r.fits_weights &&
			    r.gpu > o.gpu_mem)
				abort();
		}
	}
	json_decref(cfg);
	char s[64];
	size_t n = size < sizeof s - 1 ? size : sizeof s - 1;
	memcpy(s, data, n);
	s[n] = 0;
	uint64_t v;
	(void)plan_parse_size(s, &v, err, sizeof err);
	return 0;
}
