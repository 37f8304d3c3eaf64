/* libFuzzer target: the JSON parser, and the config reader on top of it. */
#include <stddef.h>
#include <stdint.h>

#include "../../loader/config.h"
#include "../../loader/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_doc *doc;
    polar_error err;
    if (json_parse((const char *)data, size, "fuzz", &doc, &err) == POLAR_OK) {
        json_get(json_root(doc), "model_type");
        json_free(doc);
    }
    polar_arch a;
    config_parse((const char *)data, size, "fuzz", &a, &err);
    return 0;
}
