/* Choosing the CPU microkernels: one table of every ISA compiled in, best first, checked
 * against this CPU at run time (avx512bf16 passed over where its products are the slower:
 * slow_dpbf16). FA_ISA=<name> forces one; FA_ISA_VERBOSE=1 logs the choice on stderr.
 *
 * Adding an ISA: compile its file (isa_<name>.c, defining `const fa_isa fa_isa_<name>`)
 * and define FA_HAVE_ISA_<NAME> for this file; its slot below then joins the table. */
#include "isa.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_HAVE_ISA_AMX
extern const fa_isa fa_isa_amx;
#endif
#ifdef FA_HAVE_ISA_AVX512BF16
extern const fa_isa fa_isa_avx512bf16;
#endif
#ifdef FA_HAVE_ISA_AVX512
extern const fa_isa fa_isa_avx512;
#endif
#ifdef FA_HAVE_ISA_AVX2
extern const fa_isa fa_isa_avx2;
#endif

/* Tile defaults (bench/RESULTS.md): the products reach ~92% of the FMA peak at 256 x 128
 * without masks; masked problems skip whole tiles, which pays more with 128 rows; the
 * backward keeps five tiles live and prefers 128 x 128. f32 forward without masks over
 * 2048 keys and more: 256 keys per tile halve the per-row work (row max, exp sum) against
 * the products, 1-4% faster at S = 4096 and 16384, no faster at S = 1024. f32 backward
 * without masks, S >= 4096 and D >= 128: 128 x 256 ran 4-5% faster (the products' inner
 * dimension doubles for dq); with masks, shorter or D = 64, and in bf16 it gained nothing. */
const fa_isa_tiles fa_isa_tiles_default = {.bq = 128, .bk = 128, .open_bq = 256, .bf16_open_bq = 128,
                                           .bf16_open_bk = 128, .long_keys = 2048, .long_bk = 256,
                                           .bwd_long_keys = 4096, .bwd_long_dim = 128, .bwd_long_bk = 256};
/* With the bf16-pair passes, bf16 without masks: 256 keys halve the per-row work of a tile
 * against its products, and 256 rows halve the packing of k and v per query row: 256 x 256
 * ran 4-6% faster than 128 x 128 (B=1 H=8 S=4096 D=128, 2 threads); masked, 128 x 256 was
 * no faster. */
const fa_isa_tiles fa_isa_tiles_bf16_pairs = {.bq = 128, .bk = 128, .open_bq = 256, .bf16_open_bq = 256,
                                              .bf16_open_bk = 256, .long_keys = 2048, .long_bk = 256,
                                              .bwd_long_keys = 4096, .bwd_long_dim = 128, .bwd_long_bk = 256};
/* AMX (measured on its Xeon, 2 threads, bf16 forward, 3 alternations each): 256 keys per
 * tile where the keys are long (>= 2048), D >= 128 and the wider tiles execute few more
 * elements (backend_cpu.c, wider_keys): 128 x 256 against 128 x 128 ran 6% faster causal
 * at S = 4096, 9-11% at S = 16384, 7-9% at S = 8192 D = 256, 8-14% unmasked at S = 4096
 * and 8192 (D = 128), 4-7% chunked (2048, S = 16384); slower at D = 64 (S = 2048 causal:
 * 7%), for 16 documents in 16384 (2-6%, before the forward's slices; with them 0.052-0.055 s
 * against 0.058 s at 128 keys, 2026-12-05, and the plan takes 256) and under a window of 512. The backward, without a
 * mask or window (causal or not): 2.5% faster causal at S = 4096, 2-5% at 8192, 7-8%
 * unmasked at 4096 (4 alternations each); chunked and windowed within 2%, left at 128.
 * Then 512 keys in the forward, under the same rule (2026-12-06, bench/RESULTS.md: 512
 * against 256, medians of 3 alternations, bf16 D = 128 unless said): causal S = 16384 0.93,
 * S = 4096 0.91, S = 2048 0.97, unmasked S = 4096 0.92, D = 256 causal S = 8192 0.94,
 * chunked 2048 and 16 documents in 16384 0.95; a window of 1024, which executes more
 * elements in them (refused by the rule), 1.02. Then the forward's rule for every key count
 * and head dim (2026-12-07, bench/RESULTS.md: 128 x 512 against 128 x 128, medians of 3
 * alternations, causal and unmasked): S = 256 to 1536 at D = 32 to 256 0.82-0.98 (one case
 * 0.99, S = 256 D = 64 unmasked), S = 2048 and 4096 at D = 64 0.87-0.91. The backward at
 * 256 keys below 2048 was 4-18% slower causal, so it keeps its rule. */
const fa_isa_tiles fa_isa_tiles_amx = {.bq = 128, .bk = 128, .open_bq = 256, .bf16_open_bq = 128,
                                       .bf16_open_bk = 128, .long_keys = 2048, .long_bk = 256,
                                       .bwd_long_keys = 4096, .bwd_long_dim = 128, .bwd_long_bk = 256,
                                       .bf16_long_bk = 256, .bf16_wider_bk = 512, .fwd_run_bytes = 2 << 20};

/* Best first; the scalar table is last and always available. */
static const fa_isa *const isa_table[] = {
#ifdef FA_HAVE_ISA_AMX
    &fa_isa_amx,
#endif
#ifdef FA_HAVE_ISA_AVX512BF16
    &fa_isa_avx512bf16,
#endif
#ifdef FA_HAVE_ISA_AVX512
    &fa_isa_avx512,
#endif
#ifdef FA_HAVE_ISA_AVX2
    &fa_isa_avx2,
#endif
    &fa_isa_scalar,
};
#define ISA_COUNT (sizeof isa_table / sizeof isa_table[0])

/* Every name FA_ISA may give, built into this copy or not. */
static const char *const known_names[] = {"amx", "avx512bf16", "avx512", "avx2", "scalar"};
#define KNOWN_COUNT (sizeof known_names / sizeof known_names[0])

/* 1 where vdpbf16ps runs fewer products a cycle than f32 multiply-adds, so that the
 * avx512 table (bf16 widened to f32, then fused multiply-adds) is faster than avx512bf16:
 * Intel's cores. On an Emerald Rapids core (2 threads, tools/peak_loops.c) vdpbf16ps ran
 * 86 GFLOP/s a thread against the multiply-adds' 176 (one every 2 cycles against 2 a cycle),
 * and the avx512 table's bf16 forward and backward took 0.57-0.73 of avx512bf16's time
 * (bench/RESULTS.md, 2026-12-07, eighteenth session); on Zen 4 vdpbf16ps runs 2x the
 * multiply-adds' flops. Intel's CPUs with AMX take the amx table before either. */
static int slow_dpbf16(void) { return __builtin_cpu_is("intel"); }

/* The last choice logged, so FA_ISA_VERBOSE prints each change once, not once per plan. */
static _Atomic(const fa_isa *) last_logged;

static void log_choice(const fa_isa *isa, int forced) {
    const char *v = getenv("FA_ISA_VERBOSE");
    if (!v || !*v || strcmp(v, "0") == 0) return;
    if (atomic_exchange(&last_logged, isa) == isa) return;
    fprintf(stderr, "flashattn: cpu isa %s (%s; compiled in:", isa->name, forced ? "forced by FA_ISA" : "the fastest available");
    for (size_t i = 0; i < ISA_COUNT; i++)
        fprintf(stderr, " %s%s", isa_table[i]->name, isa_table[i]->available() ? "" : "[unavailable]");
    fprintf(stderr, ")\n");
}

/* The names usable here, best first ("avx512 avx2 scalar"). */
static const char *usable_names(char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < ISA_COUNT && n < len; i++)
        if (isa_table[i]->available()) n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? " " : "", isa_table[i]->name);
    return buf;
}

/* An FA_ISA this copy cannot run (unknown, not built, or not on this CPU) is the caller's
 * setting to fix, so all three are FA_ERR_INVALID (the CLI exits 2) and say what would run. */
fa_status fa_isa_select(const fa_isa **out) {
    const char *want = getenv("FA_ISA");
    if (want && *want && strcmp(want, "auto") != 0) {
        char usable[128];
        for (size_t i = 0; i < ISA_COUNT; i++) {
            if (strcmp(isa_table[i]->name, want) != 0) continue;
            if (!isa_table[i]->available())
                return fa_error(FA_ERR_INVALID, "FA_ISA=%s: this CPU (or OS) does not support %s; it has: %s", want,
                                want, usable_names(usable, sizeof usable));
            *out = isa_table[i];
            log_choice(*out, 1);
            return FA_OK;
        }
        for (size_t i = 0; i < KNOWN_COUNT; i++)
            if (strcmp(known_names[i], want) == 0)
                return fa_error(FA_ERR_INVALID, "FA_ISA=%s: this build of flashattn has no %s kernels; usable here: %s",
                                want, want, usable_names(usable, sizeof usable));
        return fa_error(FA_ERR_INVALID, "FA_ISA=%.40s is not a known ISA (use auto, amx, avx512bf16, avx512, avx2 or scalar; usable here: %s)",
                        want, usable_names(usable, sizeof usable));
    }
    for (size_t i = 0; i < ISA_COUNT; i++) {
        if (isa_table[i]->available() && !(strcmp(isa_table[i]->name, "avx512bf16") == 0 && slow_dpbf16())) {
            *out = isa_table[i];
            log_choice(*out, 0);
            return FA_OK;
        }
    }
    *out = &fa_isa_scalar; /* unreachable: scalar is always available */
    return FA_OK;
}

const char *fa_cpu_isa(void) {
    const fa_isa *isa = NULL;
    if (fa_isa_select(&isa) != FA_OK) return "none";
    return isa->name;
}
