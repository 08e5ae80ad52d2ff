/*
 * api_test.h - helpers for the tests of the APIs on the chat path (test_responses.c,
 * test_messages.c): a request's chat request or its refusal, JSON compared as values, a
 * result parsed, a stream's events gathered.
 */
#ifndef WICK_TEST_API_TEST_H
#define WICK_TEST_API_TEST_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "worker/http_int.h"

/* The chat request of an API's body (and its skeleton, when skel is not NULL). */
static inline json_t *api_chat_of(const struct oai_api *api, const char *body, json_t **skel)
{
	json_t *chat, *sk;
	struct oai_err e;
	int st = api->to_chat(body, strlen(body), &chat, &sk, &e);
	cr_assert_eq(st, 0, "%s: %d %s", body, st, e.message);
	if (skel)
		*skel = sk;
	else
		json_decref(sk);
	return chat;
}

/* The refusal of an API's body: an HTTP status, and nothing made. */
static inline struct oai_err api_refusal_of(const struct oai_api *api, const char *body)
{
	json_t *chat, *sk;
	struct oai_err e;
	int st = api->to_chat(body, strlen(body), &chat, &sk, &e);
	cr_assert_neq(st, 0, "accepted: %s", body);
	cr_assert_eq(st, e.status);
	cr_assert(!chat && !sk);
	return e;
}

/* got equals the JSON value want (any order of members). */
static inline void expect_json(const json_t *got, const char *want)
{
	json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
	cr_assert_not_null(w, "bad test JSON: %s", want);
	char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
	char *ws = json_dumps(w, JSON_COMPACT | JSON_SORT_KEYS);
	cr_expect(json_equal((json_t *)got, w), "got %s\nwant %s", g, ws);
	free(g);
	free(ws);
	json_decref(w);
}

static inline struct oai_result result_of(const char *json)
{
	struct oai_result r;
	cr_assert_eq(oai_result_parse(json, strlen(json), &r), WK_OK);
	return r;
}

/* Appends evs' events to all (taking evs). */
static inline void take(json_t *all, json_t *evs)
{
	cr_assert_not_null(evs);
	json_array_extend(all, evs);
	json_decref(evs);
}

#endif
