/* safetensors parsing: a valid file round-trips through st_write; every
 * malformed header is refused with a message naming the fault. */
#include <unistd.h>

#include "../loader/safetensors.h"
#include "harness.h"

/* A file image: 8-byte length, header text, then data_size bytes. */
static unsigned char *image(const char *header, uint64_t claimed_len, size_t data_size, size_t *size) {
    size_t h = strlen(header);
    *size = 8 + h + data_size;
    unsigned char *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(claimed_len >> (8 * i));
    memcpy(b + 8, header, h);
    return b;
}

static void expect_bad(const char *header, int64_t claimed, size_t data_size, const char *why) {
    size_t size;
    unsigned char *b = image(header, claimed < 0 ? strlen(header) : (uint64_t)claimed, data_size, &size);
    st_file f;
    polar_error err = {0};
    polar_status st = st_parse("x.safetensors", b, size, &f, &err);
    CHECK(st == POLAR_ERR_FORMAT, "header %s must fail", header);
    CHECK(strstr(err.msg, why) && strstr(err.msg, "x.safetensors"), "message '%s' lacks '%s'", err.msg, why);
    free(b);
}

static void st_valid(void) {
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                    "\"a\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[0,4]},"
                    "\"e\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[12,12]}}";
    size_t size;
    unsigned char *b = image(h, strlen(h), 12, &size);
    st_file f;
    polar_error err;
    CHECK_OK(st_parse("x.safetensors", b, size, &f, &err));
    CHECK(f.n == 3, "3 tensors, metadata skipped");
    const st_tensor *a = st_find(&f, "a"), *t = st_find(&f, "b");
    CHECK(a && a->dtype == ST_BF16 && a->ndim == 2 && a->shape[1] == 2 && a->nbytes == 4, "tensor a");
    CHECK(t && t->data == b + 8 + strlen(h) + 4, "tensor b points into the data section");
    CHECK(st_find(&f, "zz") == NULL, "absent tensor");
    st_close(&f);
    free(b);
}

static void st_malformed(void) {
    expect_bad("", 0, 0, "unexpected end of input"); /* an empty header is no JSON object */
    size_t size;
    st_file f;
    polar_error err = {0};
    CHECK(st_parse("x.safetensors", "abc", 3, &f, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "truncated"),
          "3-byte file: %s", err.msg);
    expect_bad("{}", 1000, 0, "past the end");
    expect_bad("{}", (int64_t)1 << 40, 0, "exceeds");
    expect_bad("[1]", -1, 0, "not a JSON object");
    expect_bad("{\"a\":", -1, 0, "JSON syntax error");
    expect_bad("{\"a\":1}", -1, 0, "not an object");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "dtype");
    expect_bad("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4, "unknown dtype 'Q4'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", -1, 4, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", -1, 4, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", -1, 4, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", -1, 4, "dimensions");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", -1, 4,
               "overflows");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", -1, 4, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", -1, 4, "backwards");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, 4, "past the data section");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", -1, 8, "needs 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               -1, 8, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               -1, 8, "twice");
    (void)size;
}

static void st_files(void) {
    polar_error err;
    st_file f;
    CHECK(st_open("/nonexistent/x.safetensors", &f, &err) == POLAR_ERR_IO && strstr(err.msg, "cannot open"),
          "missing file: %s", err.msg);
    CHECK(st_open("tests", &f, &err) == POLAR_ERR_IO, "a directory: %s", err.msg);
    char dir[] = "/tmp/polar-st-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[128];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float x[3] = {1, 2, 3};
    uint16_t y[2] = {0x3f80, 0x4000};
    st_write_tensor w[2] = {{"x", ST_F32, 1, {3}, x}, {"odd \"name\"", ST_BF16, 2, {1, 2}, y}};
    CHECK_OK(st_write(path, w, 2, &err));
    CHECK_OK(st_open(path, &f, &err));
    const st_tensor *t = st_find(&f, "x"), *u = st_find(&f, "odd \"name\"");
    CHECK(t && memcmp(t->data, x, sizeof x) == 0, "x round trip");
    CHECK(u && u->ndim == 2 && memcmp(u->data, y, sizeof y) == 0, "escaped name round trip");
    CHECK(((uintptr_t)t->data - (uintptr_t)f.map) % 8 == 0, "data section 8-byte aligned");
    st_close(&f);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    RUN(st_valid);
    RUN(st_malformed);
    RUN(st_files);
    TEST_EXIT();
}
