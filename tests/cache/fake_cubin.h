/* The start of a cubin as a cache record must hold one (cache.h): a 64-bit
 * little-endian ELF header for EM_CUDA whose e_flags name the sm, in the
 * CUDA ELF ABI NVRTC 13 writes (version 8, the sm in bits 8..15), with no
 * program or section headers. The test fills the rest of the cubin. */
#ifndef KILN_TEST_FAKE_CUBIN_H
#define KILN_TEST_FAKE_CUBIN_H

#include <stdint.h>
#include <string.h>

enum { KT_ELF_HEADER = 64 };

static inline void kt_elf_header(uint8_t *p, unsigned sm)
{
    memset(p, 0, KT_ELF_HEADER);
    memcpy(p, "\x7f" "ELF", 4);
    p[4] = 2;      /* ELFCLASS64 */
    p[5] = 1;      /* ELFDATA2LSB */
    p[6] = 1;      /* EV_CURRENT */
    p[7] = 0x41;   /* the CUDA OS/ABI */
    p[8] = 8;      /* its version */
    p[16] = 2;     /* ET_EXEC */
    p[18] = 190;   /* EM_CUDA */
    p[20] = 1;     /* e_version */
    uint32_t flags = 0x6000004u | sm << 8;
    for (int i = 0; i < 4; i++)
        p[48 + i] = (uint8_t)(flags >> (8 * i));
    p[52] = KT_ELF_HEADER; /* e_ehsize */
}

#endif
