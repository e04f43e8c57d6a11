/* Job status: state names and transitions, the hash field encoding both ways (full and
 * partial), the event JSON both ways, and the errors for malformed or newer input. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "proto/status.h"

static void fill(qp_status *st)
{
    qp_status_init(st);
    qp_status_set_str(&st->id, "j-00ff00ff00ff00ff");
    st->state = QP_STATE_RUNNING;
    qp_status_set_str(&st->stage, "quantize");
    st->block = 3;
    st->n_blocks = 22;
    qp_status_set_str(&st->layer, "model.layers.3.mlp.down_proj");
    st->progress = 0.1875;
    st->eta_s = 612.25;
    st->layer_error = 0.000123456789;
    qp_status_set_str(&st->node, "gpu-a");
    qp_status_set_str(&st->worker, "cuda0");
    st->attempts = 2;
    qp_status_set_str(&st->error, "worker cuda0 exited with signal 9; retrying from block 3");
    qp_status_set_str(&st->output, "/data/out/llama-w4 with spaces");
    st->submitted_ms = 1700000000123LL;
    st->started_ms = 1700000001456LL;
    st->updated_ms = 1700000099999LL;
    st->finished_ms = 0;
    qp_status_set_str(&st->report, "{ \"layers\": 154, \"seconds\": 81.5, \"ppl\": {\"before\": 12.5, \"after\": 12.9} }");
    qp_status_set_str(&st->last_block, "{\"block\": 2, \"seconds\": 41.5, \"stages\": {\"calibrate\": 20.25}}");
    qp_status_set_str(&st->estimate, "{\"peak_ram_bytes\": 180650024, \"disk_bytes\": 4433920}");
    qp_status_set_str(&st->parts, "[ {\"worker\": \"cpu-1\", \"block\": 3, \"step\": \"quantize\", \"part\": 5, "
                                  "\"layer\": \"mlp.down_proj\"}, {\"worker\": \"cpu-0\", \"block\": 3, \"step\": "
                                  "\"quantize\", \"part\": 6} ]");
}

#define PARTS_COMPACT "[{\"worker\":\"cpu-1\",\"block\":3,\"step\":\"quantize\",\"part\":5,\"layer\":\"mlp.down_proj\"}," \
                      "{\"worker\":\"cpu-0\",\"block\":3,\"step\":\"quantize\",\"part\":6}]"

static void check_same(const qp_status *a, const qp_status *b)
{
    CHECK_STR(a->id, b->id);
    CHECK_INT(a->state, b->state);
    CHECK_STR(a->stage, b->stage);
    CHECK_INT(a->block, b->block);
    CHECK_INT(a->n_blocks, b->n_blocks);
    CHECK_STR(a->layer, b->layer);
    CHECK(a->progress == b->progress);
    CHECK(a->eta_s == b->eta_s);
    CHECK(a->layer_error == b->layer_error);   /* bit-exact: numbers print round-trippably */
    CHECK_STR(a->node, b->node);
    CHECK_STR(a->worker, b->worker);
    CHECK_INT(a->attempts, b->attempts);
    CHECK_STR(a->error, b->error);
    CHECK_STR(a->output, b->output);
    CHECK_INT(a->submitted_ms, b->submitted_ms);
    CHECK_INT(a->started_ms, b->started_ms);
    CHECK_INT(a->updated_ms, b->updated_ms);
    CHECK_INT(a->finished_ms, b->finished_ms);
    CHECK_STR(a->last_block ? "set" : "unset", b->last_block ? "set" : "unset");
    CHECK_STR(a->estimate ? "set" : "unset", b->estimate ? "set" : "unset");
    CHECK_STR(a->parts ? "set" : "unset", b->parts ? "set" : "unset");
}

static void test_states(void)
{
    qp_state s;
    const char *names[] = { "queued", "running", "done", "failed", "cancelled" };
    for (int i = 0; i < 5; i++) {
        CHECK_STR(qp_state_name((qp_state)i), names[i]);
        CHECK_OK(qp_state_parse(names[i], &s));
        CHECK_INT(s, i);
    }
    CHECK(qp_state_name((qp_state)9) == NULL);
    CHECK_ERR(qp_state_parse("Running", &s));
    CHECK(!qp_state_is_final(QP_STATE_QUEUED));
    CHECK(!qp_state_is_final(QP_STATE_RUNNING));
    CHECK(qp_state_is_final(QP_STATE_DONE) && qp_state_is_final(QP_STATE_FAILED) && qp_state_is_final(QP_STATE_CANCELLED));
    CHECK(qp_state_can_move(QP_STATE_QUEUED, QP_STATE_RUNNING));
    CHECK(qp_state_can_move(QP_STATE_QUEUED, QP_STATE_FAILED));      /* invalid at admission */
    CHECK(qp_state_can_move(QP_STATE_QUEUED, QP_STATE_CANCELLED));
    CHECK(!qp_state_can_move(QP_STATE_QUEUED, QP_STATE_DONE));
    CHECK(qp_state_can_move(QP_STATE_RUNNING, QP_STATE_QUEUED));     /* handed back */
    CHECK(qp_state_can_move(QP_STATE_RUNNING, QP_STATE_DONE));
    CHECK(qp_state_can_move(QP_STATE_RUNNING, QP_STATE_RUNNING));
    CHECK(!qp_state_can_move(QP_STATE_DONE, QP_STATE_RUNNING));
    CHECK(!qp_state_can_move(QP_STATE_CANCELLED, QP_STATE_FAILED));
    CHECK(qp_state_can_move(QP_STATE_FAILED, QP_STATE_QUEUED));      /* resubmitted */
    CHECK_STR(qp_event_type_name(QP_EVENT_LAYER), "layer");
}

static void test_fields_round_trip(void)
{
    qp_status a, b;
    fill(&a);
    qp_fields f;
    qp_err err = { 0 };
    CHECK_OK(qp_status_to_fields(&a, QP_SF_ALL, &f, &err));
    CHECK_INT(f.n, 23);   /* "v" + 22 fields */
    CHECK_STR(f.name[0], "v");
    CHECK_STR(f.value[0], "1");
    /* Spot-check the text Redis will hold. */
    for (size_t i = 0; i < f.n; i++) {
        if (!strcmp(f.name[i], "state")) CHECK_STR(f.value[i], "running");
        if (!strcmp(f.name[i], "progress")) CHECK_STR(f.value[i], "0.1875");
        if (!strcmp(f.name[i], "eta_s")) CHECK_STR(f.value[i], "612.25");
        if (!strcmp(f.name[i], "finished_ms")) CHECK_STR(f.value[i], "0");
        if (!strcmp(f.name[i], "submitted_ms")) CHECK_STR(f.value[i], "1700000000123");
        if (!strcmp(f.name[i], "report"))
            CHECK_STR(f.value[i], "{\"layers\":154,\"seconds\":81.5,\"ppl\":{\"before\":12.5,\"after\":12.9}}");
        if (!strcmp(f.name[i], "estimate")) CHECK_STR(f.value[i], "{\"peak_ram_bytes\":180650024,\"disk_bytes\":4433920}");
        if (!strcmp(f.name[i], "parts")) CHECK_STR(f.value[i], PARTS_COMPACT);
    }
    /* Back, through the HGETALL-shaped array, with an extra "spec" field that is ignored. */
    const char *kv[2 * QP_STATUS_MAX_FIELDS + 2];
    size_t n = 0;
    for (size_t i = 0; i < f.n; i++) { kv[n++] = f.name[i]; kv[n++] = f.value[i]; }
    kv[n++] = QP_STATUS_FIELD_SPEC;
    kv[n++] = "{\"model\":\"m\"}";
    qp_status_init(&b);
    CHECK_OK(qp_status_from_fields(&b, kv, n, &err));
    check_same(&a, &b);
    CHECK_STR(b.report, "{\"layers\":154,\"seconds\":81.5,\"ppl\":{\"before\":12.5,\"after\":12.9}}");
    CHECK_STR(b.last_block, "{\"block\":2,\"seconds\":41.5,\"stages\":{\"calibrate\":20.25}}");
    CHECK_STR(b.estimate, "{\"peak_ram_bytes\":180650024,\"disk_bytes\":4433920}");
    CHECK_STR(b.parts, PARTS_COMPACT);
    qp_fields_free(&f);
    qp_status_clear(&b);

    /* Unset strings are written as "" and read back as NULL, clearing stale values. */
    qp_status c;
    qp_status_init(&c);
    qp_status_set_str(&c.id, "x1");
    CHECK_OK(qp_status_to_fields(&c, QP_SF_ALL, &f, &err));
    qp_status_init(&b);
    qp_status_set_str(&b.error, "stale");
    for (size_t i = 0; i < f.n; i++) CHECK_OK(qp_status_set_field(&b, f.name[i], f.value[i], &err));
    CHECK(b.error == NULL && b.report == NULL && b.stage == NULL && b.parts == NULL);
    CHECK_INT(b.block, -1);
    CHECK(b.eta_s == -1 && b.layer_error == -1);
    qp_fields_free(&f);
    qp_status_clear(&b);
    qp_status_clear(&c);

    /* A partial update carries only its group, plus v, id and updated_ms. */
    CHECK_OK(qp_status_to_fields(&a, QP_SF_PROGRESS, &f, &err));
    CHECK_INT(f.n, 11);   /* v, id, updated_ms + the 8 progress fields */
    int saw_state = 0, saw_updated = 0, saw_block = 0;
    for (size_t i = 0; i < f.n; i++) {
        saw_state |= !strcmp(f.name[i], "state");
        saw_updated |= !strcmp(f.name[i], "updated_ms");
        saw_block |= !strcmp(f.name[i], "block");
    }
    CHECK(!saw_state && saw_updated && saw_block);
    qp_fields_free(&f);
    /* The estimate rides with the state: every state write (the take's included) has it. */
    CHECK_OK(qp_status_to_fields(&a, QP_SF_STATE | QP_SF_PLACE, &f, &err));
    CHECK_INT(f.n, 8);   /* v, id, updated_ms + state, attempts, estimate + node, worker */
    int saw_estimate = 0;
    for (size_t i = 0; i < f.n; i++) saw_estimate |= !strcmp(f.name[i], "estimate");
    CHECK(saw_estimate);
    qp_fields_free(&f);
    /* The parts in flight go alone when they change. */
    CHECK_OK(qp_status_to_fields(&a, QP_SF_PARTS, &f, &err));
    CHECK_INT(f.n, 4);   /* v, id, updated_ms + parts */
    CHECK_STR(f.name[3], "parts");
    qp_fields_free(&f);

    /* Deep copy. */
    CHECK_OK(qp_status_copy(&b, &a));
    CHECK(b.layer != a.layer);
    check_same(&a, &b);
    qp_status_clear(&b);
    qp_status_clear(&a);
    qp_status_clear(NULL);
}

static void test_fields_errors(void)
{
    qp_status st;
    qp_status_init(&st);
    qp_err err = { 0 };
    CHECK_INT(qp_status_set_field(&st, "progress", "half", &err), QP_EFORMAT);
    CHECK_STR(err.msg, "status.progress: \"half\" is not a number");
    CHECK_INT(qp_status_set_field(&st, "block", "3.5", &err), QP_EFORMAT);
    CHECK_STR(err.msg, "status.block: \"3.5\" is not an integer");
    CHECK_INT(qp_status_set_field(&st, "block", "99999999999", &err), QP_EFORMAT);
    CHECK_INT(qp_status_set_field(&st, "state", "sleeping", &err), QP_EFORMAT);
    CHECK_CONTAINS(err.msg, "status.state: \"sleeping\" is not one of");
    CHECK_INT(qp_status_set_field(&st, "eta_s", "inf", &err), QP_EFORMAT);
    CHECK_INT(qp_status_set_field(&st, "v", "2", &err), QP_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "status.v: version 2 is newer");
    CHECK_OK(qp_status_set_field(&st, "v", "1", &err));
    CHECK_OK(qp_status_set_field(&st, "some_future_field", "x", &err));
    const char *odd[] = { "id" };
    CHECK_ERR(qp_status_from_fields(&st, odd, 1, &err));
    /* Encoding refuses an invalid id or a report that is not an object. */
    qp_fields f;
    CHECK_ERR(qp_status_to_fields(&st, QP_SF_ALL, &f, &err));
    CHECK_CONTAINS(err.msg, "status.id");
    qp_status_set_str(&st.id, "ok");
    qp_status_set_str(&st.report, "[1,2]");
    CHECK_INT(qp_status_to_fields(&st, QP_SF_ALL, &f, &err), QP_EFORMAT);
    CHECK_STR(err.msg, "status.report: must be a JSON object");
    qp_status_set_str(&st.report, NULL);
    qp_status_set_str(&st.estimate, "123");
    CHECK_INT(qp_status_to_fields(&st, QP_SF_STATE, &f, &err), QP_EFORMAT);
    CHECK_STR(err.msg, "status.estimate: must be a JSON object");
    qp_status_set_str(&st.estimate, NULL);
    qp_status_set_str(&st.parts, "{\"worker\":\"cpu-0\"}");
    CHECK_INT(qp_status_to_fields(&st, QP_SF_PARTS, &f, &err), QP_EFORMAT);
    CHECK_STR(err.msg, "status.parts: must be a JSON array");
    CHECK(qp_status_to_event(&st, QP_EVENT_PROGRESS) == NULL);
    qp_status_set_str(&st.parts, NULL);
    qp_status_set_str(&st.report, "[1,2]");
    CHECK(qp_status_to_event(&st, QP_EVENT_STATE) == NULL);
    qp_status_clear(&st);
    /* An event whose parts is no array is refused, naming the field. */
    const char *bad = "{\"v\":1,\"type\":\"progress\",\"id\":\"x\",\"parts\":{\"part\":1}}";
    CHECK_INT(qp_status_from_event(&st, NULL, bad, strlen(bad), &err), QP_EFORMAT);
    CHECK_STR(err.msg, "event.parts: must be an array, got an object");
    qp_status_clear(&st);
}

static void test_event_round_trip(void)
{
    qp_status a, b;
    fill(&a);
    char *ev = qp_status_to_event(&a, QP_EVENT_LAYER);
    CHECK(ev != NULL);
    if (!ev) return;
    CHECK(strncmp(ev, "{\"v\":1,\"type\":\"layer\",\"id\":\"j-00ff00ff00ff00ff\",\"state\":\"running\"", 64) == 0);
    CHECK_CONTAINS(ev, "\"report\":{\"layers\":154,");
    CHECK_CONTAINS(ev, "\"estimate\":{\"peak_ram_bytes\":180650024,\"disk_bytes\":4433920}");
    CHECK_CONTAINS(ev, "\"parts\":" PARTS_COMPACT);
    qp_event_type t = QP_EVENT_STATE;
    qp_err err = { 0 };
    CHECK_OK(qp_status_from_event(&b, &t, ev, strlen(ev), &err));
    CHECK_INT(t, QP_EVENT_LAYER);
    check_same(&a, &b);
    CHECK_STR(b.report, "{\"layers\":154,\"seconds\":81.5,\"ppl\":{\"before\":12.5,\"after\":12.9}}");
    CHECK_STR(b.estimate, "{\"peak_ram_bytes\":180650024,\"disk_bytes\":4433920}");
    CHECK_STR(b.parts, PARTS_COMPACT);
    /* Encoding what was decoded gives the same bytes. */
    char *ev2 = qp_status_to_event(&b, QP_EVENT_LAYER);
    CHECK_STR(ev2, ev);
    free(ev2);
    free(ev);
    qp_status_clear(&b);

    /* A minimal status leaves unset strings out of the event. */
    qp_status_clear(&a);
    qp_status_set_str(&a.id, "min");
    a.state = QP_STATE_QUEUED;
    a.submitted_ms = 5;
    ev = qp_status_to_event(&a, QP_EVENT_STATE);
    CHECK(ev && !strstr(ev, "\"error\"") && !strstr(ev, "\"report\"") && !strstr(ev, "\"node\"") && !strstr(ev, "\"parts\""));
    CHECK_OK(qp_status_from_event(&b, NULL, ev, strlen(ev), &err));
    CHECK(b.error == NULL && b.node == NULL);
    CHECK_INT(b.block, -1);
    CHECK_INT(b.submitted_ms, 5);
    free(ev);
    qp_status_clear(&b);
    qp_status_clear(&a);
}

static void test_event_errors(void)
{
    qp_status st;
    qp_err err = { 0 };
#define BAD(json, want) do { const char *_j = (json); CHECK_ERR(qp_status_from_event(&st, NULL, _j, strlen(_j), &err)); \
        CHECK_CONTAINS(err.msg, want); qp_status_clear(&st); } while (0)
    BAD("{", "event: invalid JSON");
    BAD("[]", "event: expected a JSON object, got an array");
    BAD("{\"type\":\"state\",\"id\":\"a\"}", "event.v: missing");
    BAD("{\"v\":2,\"type\":\"state\",\"id\":\"a\"}", "event.v: version 2 is newer");
    BAD("{\"v\":1,\"type\":\"bogus\",\"id\":\"a\"}", "event.type: must be one of state, progress, layer, got \"bogus\"");
    BAD("{\"v\":1,\"type\":\"state\"}", "event.id: missing");
    BAD("{\"v\":1,\"type\":\"state\",\"id\":\"a\",\"state\":\"zombie\"}", "event.state: must be one of");
    BAD("{\"v\":1,\"type\":\"state\",\"id\":\"a\",\"progress\":\"x\"}", "event.progress: must be a number, got a string");
    BAD("{\"v\":1,\"type\":\"state\",\"id\":\"a\",\"block\":1.5}", "event.block: must be an integer, got 1.5");
    BAD("{\"v\":1,\"type\":\"state\",\"id\":\"a\",\"node\":7}", "event.node: must be a string, got 7");
    BAD("{\"v\":1,\"type\":\"state\",\"id\":\"a\",\"report\":\"r\"}", "event.report: must be an object");
    BAD("{\"v\":1,\"type\":\"progress\",\"id\":\"a\",\"last_block\":3}", "event.last_block: must be an object");
    BAD("{\"v\":1,\"type\":\"state\",\"id\":\"a\",\"estimate\":\"1 GB\"}", "event.estimate: must be an object");
#undef BAD
    /* Unknown fields from a newer writer are ignored. */
    const char *ok = "{\"v\":1,\"type\":\"progress\",\"id\":\"a\",\"gpu_mem\":123,\"progress\":0.5}";
    CHECK_OK(qp_status_from_event(&st, NULL, ok, strlen(ok), &err));
    CHECK(st.progress == 0.5);
    qp_status_clear(&st);
}

int main(void)
{
    TEST_RUN(test_states);
    TEST_RUN(test_fields_round_trip);
    TEST_RUN(test_fields_errors);
    TEST_RUN(test_event_round_trip);
    TEST_RUN(test_event_errors);
    return test_finish();
}
