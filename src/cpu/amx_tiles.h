/* The AMX tile instructions as the AMX kernels use them (isa_amx.c, decode_cache_amx.c),
 * for files built with -mamx-tile, -mamx-bf16 and -mamx-int8. Tile state belongs to the
 * thread: a kernel loads its configuration on entry and releases the tiles on exit. The
 * configuration is loaded with our own ldtilecfg (GCC 12's _tile_loadconfig tells the
 * compiler it reads 8 bytes, not 64), and tiles are loaded with our own tileloadd that
 * clobbers memory (GCC's does not, so stores into a buffer read only by a tile load could
 * be dropped). */
#ifndef FA_CPU_AMX_TILES_H
#define FA_CPU_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile t */
    uint8_t rows[16];
} __attribute__((aligned(64))) fa_tile_config;
_Static_assert(sizeof(fa_tile_config) == 64, "ldtilecfg reads 64 bytes");

static inline __attribute__((always_inline)) void fa_tiles_load(const fa_tile_config *c) {
    __asm__ volatile("ldtilecfg %0" : : "m"(*c));
}
static inline __attribute__((always_inline)) void fa_tiles_release(void) { __asm__ volatile("tilerelease" ::); }

#define TILE_LOAD(t, base, stride)                                                                     \
    __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #t "|tileloadd\t%%tmm" #t ", [%0+%1*1]}"             \
                     : : "r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define TILE_ZERO(t) _tile_zero(t)

#endif
