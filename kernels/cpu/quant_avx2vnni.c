/* The avx2vnni level's block dot products: quant_avx2.c compiled again with
 * -mavxvnni, its integer sums by AVX-VNNI's 256-bit vpdpbusd in place of
 * maddubs + madd (Intel client CPUs from Alder Lake lack AVX-512 and its
 * VNNI; AMD from Zen 5 has both). Exact integer sums either way, so the
 * same bits as the avx2 level. */
#define QUANT_AVX_VNNI 1
#include "quant_avx2.c"
