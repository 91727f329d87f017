/* A plan's launches as the device runs them: the one decision the plan
 * cannot make offline, since it depends on the device's SM count. */
#include "core/build.h"

/* Blocks of smem dynamic bytes an SM's shared memory holds: each also
 * takes its static shared memory and the bytes every block reserves. */
static int64_t blocks_by_smem(const kiln_device_caps *d, int64_t smem, int64_t fixed)
{
    return (int64_t)d->smem_per_sm / (smem + fixed);
}

/* Blocks of l an SM holds at once, by shared memory and warps. */
static int64_t blocks_per_sm(const kiln_device_caps *d, const kiln_launch *l, int64_t fixed)
{
    const int64_t warps = ((int64_t)l->block[0] * l->block[1] * l->block[2] + 31) / 32;
    int64_t per_sm = blocks_by_smem(d, l->smem, fixed);
    if (warps > 0 && d->warps_per_sm / warps < per_sm)
        per_sm = d->warps_per_sm / warps;
    return per_sm;
}

void kiln_launch_finalise(const kiln_device_caps *d, kiln_launch *l)
{
    const int64_t fixed = (int64_t)d->smem_per_block_reserved + l->static_smem;
    if (l->persistent && d->sm_count > 0) {
        int64_t most = blocks_per_sm(d, l, fixed);
        most = (most < 1 ? 1 : most) * d->sm_count;
        if (l->grid[0] > most)
            l->grid[0] = (unsigned)most;
    }
    if (!l->overlap)
        return;
    if (d->sm_count <= 0) {
        l->overlap = 0;
        return;
    }
    const int64_t per_sm = blocks_per_sm(d, l, fixed);
    const int64_t blocks = (int64_t)l->grid[0] * l->grid[1] * l->grid[2];
    if (blocks > per_sm * d->sm_count)
        return;
    const int64_t p = (blocks + d->sm_count - 1) / d->sm_count;
    /* The least shared memory, in 128-byte steps, past what p + 1 blocks
     * an SM would leave each. */
    const int64_t padded = ((int64_t)d->smem_per_sm / (p + 1) - fixed + 1 + 127) / 128 * 128;
    if (per_sm > p && blocks_by_smem(d, padded, fixed) == p)
        l->smem = (unsigned)padded;
}
