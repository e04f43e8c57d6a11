/* quant/core/jsonfile.c: files read into cJSON trees (errors name the file and the byte),
 * literal numbers kept as written, and doubles written so that they read back exactly
 * (a checkpoint's per-layer errors must not lose a bit on a resume). */
#include "test_util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>

#include "quant/core/error.h"
#include "quant/core/jsonfile.h"

/* Prints o, parses the text back and returns key's value. */
static double round_trip(cJSON *o, const char *key)
{
    char *txt = cJSON_PrintUnformatted(o);
    CHECK(txt != NULL);
    cJSON *back = cJSON_Parse(txt);
    free(txt);
    CHECK(back != NULL);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(back, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsNull(v) ? -12345.0 : NAN;
    cJSON_Delete(back);
    return d;
}

static void test_add_exact(void)
{
    /* One ulp above 0.1: 15 digits print "0.1", which is within DBL_EPSILON of it. */
    const double vals[] = {nextafter(0.1, 1.0), 0.049259489813964566, 1.0 / 3.0, 0.0, -0.0, 1e-300,
                           DBL_MAX, -DBL_MIN, 123456789.123456789, 0.028209999999999999};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        cJSON *o = cJSON_CreateObject();
        CHECK(qd_json_add_exact(o, "x", vals[i]) != NULL);
        double got = round_trip(o, "x");
        CHECK(memcmp(&got, &vals[i], sizeof got) == 0 || (got == 0.0 && vals[i] == 0.0));
        cJSON_Delete(o);
    }
    cJSON *o = cJSON_CreateObject();
    qd_json_add_exact(o, "nan", NAN);
    qd_json_add_exact(o, "inf", INFINITY);
    CHECK(round_trip(o, "nan") == -12345.0);   /* null, as cJSON writes non-finite numbers */
    CHECK(round_trip(o, "inf") == -12345.0);
    cJSON_Delete(o);
}

static void test_read_errors(void)
{
    char dir[] = "/tmp/qd-jsonfile-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("{\"a\": 1, \"b\": [1, 2,, 3]}", f);
    fclose(f);
    cJSON *o = NULL;
    qd_err err = {0};
    CHECK_INT(qd_json_read_object(path, QD_INPUT_JSON, &o, &err), QD_EFORMAT);
    CHECK(strstr(err.msg, path) != NULL && strstr(err.msg, "byte") != NULL);
    CHECK(o == NULL);
    remove(path);
    snprintf(path, sizeof path, "%s/missing.json", dir);
    CHECK(qd_json_read_object(path, QD_INPUT_JSON, &o, &err) != 0);
    CHECK(strstr(err.msg, path) != NULL);
    remove(dir);
}

int main(void)
{
    TEST_RUN(test_add_exact);
    TEST_RUN(test_read_errors);
    return test_finish();
}
