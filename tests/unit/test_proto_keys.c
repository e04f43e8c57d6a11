/* Redis key layout: every key with the default and custom prefixes, name validation, buffer
 * limits, and the lease value format. */
#include "test_util.h"

#include <string.h>

#include "proto/keys.h"

static void test_default_keys(void)
{
    qp_keys k;
    char b[QP_KEY_MAX];
    CHECK_OK(qp_keys_init(&k, NULL, NULL, NULL));
    CHECK_OK(qp_key_queue(&k, b, sizeof b)); CHECK_STR(b, "qjobs");
    CHECK_OK(qp_key_processing(&k, "gpu-node-1", b, sizeof b)); CHECK_STR(b, "qjobs:processing:gpu-node-1");
    CHECK_OK(qp_key_failed(&k, b, sizeof b)); CHECK_STR(b, "qjobs:failed");
    CHECK_OK(qp_key_events_channel(&k, b, sizeof b)); CHECK_STR(b, "qjobs:events");
    CHECK_OK(qp_key_cancel_channel(&k, b, sizeof b)); CHECK_STR(b, "qjobs:cancel");
    CHECK_OK(qp_key_node(&k, "n1", b, sizeof b)); CHECK_STR(b, "qjobs:node:n1");
    CHECK_OK(qp_key_nodes(&k, b, sizeof b)); CHECK_STR(b, "qjobs:nodes");
    CHECK_OK(qp_key_fence(&k, b, sizeof b)); CHECK_STR(b, "qjobs:fence");
    CHECK_OK(qp_key_index(&k, b, sizeof b)); CHECK_STR(b, "qjobs:index");
    CHECK_OK(qp_key_status(&k, "j-0123456789abcdef", b, sizeof b)); CHECK_STR(b, "qjob:j-0123456789abcdef");
    CHECK_OK(qp_key_job_events(&k, "job1", b, sizeof b)); CHECK_STR(b, "qjob:job1:events");
    CHECK_OK(qp_key_lease(&k, "job1", b, sizeof b)); CHECK_STR(b, "qjob:job1:lease");
    CHECK_OK(qp_key_cancel(&k, "job1", b, sizeof b)); CHECK_STR(b, "qjob:job1:cancel");
    CHECK_OK(qp_key_fanout(&k, "job1", b, sizeof b)); CHECK_STR(b, "qjob:job1:fanout");
    CHECK_OK(qp_key_fanouts(&k, b, sizeof b)); CHECK_STR(b, "qjobs:fanouts");
    CHECK_OK(qp_key_parts_nodes(&k, b, sizeof b)); CHECK_STR(b, "qjobs:parts_nodes");
    CHECK_OK(qp_key_parts_channel(&k, b, sizeof b)); CHECK_STR(b, "qjobs:parts");
    CHECK_OK(qp_keys_init(&k, "", "", NULL));
    CHECK_OK(qp_key_queue(&k, b, sizeof b)); CHECK_STR(b, "qjobs");
}

static void test_custom_prefixes(void)
{
    qp_keys k;
    char b[QP_KEY_MAX];
    CHECK_OK(qp_keys_init(&k, "team-a:queue", "team-a:job", NULL));
    CHECK_OK(qp_key_processing(&k, "n1", b, sizeof b)); CHECK_STR(b, "team-a:queue:processing:n1");
    CHECK_OK(qp_key_status(&k, "x", b, sizeof b)); CHECK_STR(b, "team-a:job:x");
    CHECK_OK(qp_key_lease(&k, "x", b, sizeof b)); CHECK_STR(b, "team-a:job:x:lease");
    qp_err err = { 0 };
    CHECK_INT(qp_keys_init(&k, "q", "q", &err), QP_EINVAL);
    CHECK_CONTAINS(err.msg, "must differ");
    /* A job prefix that extends the queue with ':' could alias the cluster-wide keys. */
    CHECK_ERR(qp_keys_init(&k, "q", "q:node", &err));
    CHECK_ERR(qp_keys_init(&k, "q:x", "q", &err));
    CHECK_OK(qp_keys_init(&k, "q", "qq", &err));
    CHECK_ERR(qp_keys_init(&k, "my queue", NULL, &err));
    CHECK_CONTAINS(err.msg, "redis queue name \"my queue\"");
    CHECK_ERR(qp_keys_init(&k, NULL, "job{x}", &err));
    CHECK_CONTAINS(err.msg, "redis job key prefix");
    char longp[80];
    memset(longp, 'a', 79);
    longp[79] = '\0';
    CHECK_ERR(qp_keys_init(&k, longp, NULL, &err));
}

static void test_names_and_limits(void)
{
    qp_keys k;
    char b[QP_KEY_MAX];
    qp_keys_init(&k, NULL, NULL, NULL);
    CHECK(qp_name_valid("node_1.example-a"));
    CHECK(!qp_name_valid(""));
    CHECK(!qp_name_valid(NULL));
    CHECK(!qp_name_valid("a:b"));
    CHECK(!qp_name_valid("a b"));
    CHECK(!qp_name_valid("a*"));
    CHECK(!qp_name_valid(".hidden"));
    CHECK(!qp_name_valid("-x"));
    CHECK_ERR(qp_key_status(&k, "a:b", b, sizeof b));
    CHECK_STR(b, "");
    CHECK_ERR(qp_key_processing(&k, "bad node", b, sizeof b));
    CHECK_ERR(qp_key_node(&k, "", b, sizeof b));
    CHECK_ERR(qp_key_cancel(&k, NULL, b, sizeof b));
    CHECK_ERR(qp_key_fanout(&k, "a:b", b, sizeof b));
    /* Too small a buffer fails rather than truncating into another key's name. */
    char small[10];   /* "qjob:job1" and its NUL, exactly */
    CHECK_ERR(qp_key_status(&k, "job12345", small, sizeof small));
    CHECK_STR(small, "");
    CHECK_OK(qp_key_status(&k, "job1", small, sizeof small));
    CHECK_STR(small, "qjob:job1");
    /* The longest name with the longest prefixes fits in QP_KEY_MAX. */
    char pq[QP_PREFIX_MAX + 1], pj[QP_PREFIX_MAX + 1], id[QP_NODE_MAX + 1];
    memset(pq, 'q', QP_PREFIX_MAX); pq[QP_PREFIX_MAX] = '\0';
    memset(pj, 'j', QP_PREFIX_MAX); pj[QP_PREFIX_MAX] = '\0';
    memset(id, 'i', QP_NODE_MAX); id[QP_NODE_MAX] = '\0';
    CHECK_OK(qp_keys_init(&k, pq, pj, NULL));
    CHECK_OK(qp_key_processing(&k, id, b, sizeof b));
    CHECK_OK(qp_key_job_events(&k, id, b, sizeof b));
    CHECK_INT(strlen(b), QP_PREFIX_MAX + 1 + QP_NODE_MAX + 7);
}

static void test_lease_value(void)
{
    char b[QP_KEY_MAX], node[QP_NODE_MAX + 1];
    uint64_t t = 0;
    CHECK_OK(qp_lease_value_format(42, "node-a", b, sizeof b));
    CHECK_STR(b, "42 node-a");
    CHECK_OK(qp_lease_value_parse(b, &t, node));
    CHECK_INT(t, 42);
    CHECK_STR(node, "node-a");
    CHECK_OK(qp_lease_value_format(9007199254740991ULL, "n", b, sizeof b));
    CHECK_OK(qp_lease_value_parse(b, &t, node));
    CHECK(t == 9007199254740991ULL);
    CHECK_ERR(qp_lease_value_format(0, "n", b, sizeof b));
    CHECK_ERR(qp_lease_value_format(1, "a b", b, sizeof b));
    CHECK_INT(qp_lease_value_parse("", &t, node), QP_EFORMAT);
    CHECK_INT(qp_lease_value_parse("x node", &t, node), QP_EFORMAT);
    CHECK_INT(qp_lease_value_parse("0 node", &t, node), QP_EFORMAT);
    CHECK_INT(qp_lease_value_parse("12node", &t, node), QP_EFORMAT);
    CHECK_INT(qp_lease_value_parse("12 ", &t, node), QP_EFORMAT);
    CHECK_INT(qp_lease_value_parse("12 a b", &t, node), QP_EFORMAT);
    CHECK_INT(qp_lease_value_parse("-1 n", &t, node), QP_EFORMAT);
    CHECK_INT(qp_lease_value_parse("99999999999999999999999 n", &t, node), QP_EFORMAT);
}

int main(void)
{
    TEST_RUN(test_default_keys);
    TEST_RUN(test_custom_prefixes);
    TEST_RUN(test_names_and_limits);
    TEST_RUN(test_lease_value);
    return test_finish();
}
