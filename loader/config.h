/* config.json (+ generation_config.json) <-> polar_arch. */
#ifndef POLAR_CONFIG_H
#define POLAR_CONFIG_H

#include "polar.h"

/* Experts per token the runtime supports (config_validate enforces it). */
#define MAX_TOP_K 64

/* Read dir/config.json and, when present, dir/generation_config.json. */
polar_status config_load(const char *dir, polar_arch *out, polar_error *err);

/* Parse a config.json held in memory; `what` names it in messages. */
polar_status config_parse(const char *text, size_t len, const char *what, polar_arch *out,
                          polar_error *err);

/* Check the shape is one the runtime can run (positive sizes, heads divide). */
polar_status config_validate(const polar_arch *a, const char *what, polar_error *err);

/* Write a Hugging Face compatible config.json for this architecture. */
polar_status config_write(const polar_arch *a, const char *path, polar_error *err);

#endif
