/* Writes a PoLar predictor with hash-formula weights for the CLI tests.
 * Usage: mkpredictor D D_Q FILE */
#include "pred_util.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: mkpredictor D D_Q FILE\n");
        return 2;
    }
    return write_predictor(argv[3], atoi(argv[1]), atoi(argv[2]), NULL, NULL) == POLAR_OK ? 0 : 1;
}
