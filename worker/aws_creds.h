/*
 * aws_creds.h - AWS credentials found as the AWS SDKs find them, for the SQS driver (workers
 * and `wick submit`), so that a worker on EKS, ECS or EC2 runs on its role instead of
 * long-term keys in a secret. The first source that has them wins:
 *   1. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
 *   2. web identity (EKS IRSA): AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE (+
 *      AWS_ROLE_SESSION_NAME): STS AssumeRoleWithWebIdentity with the file's token, at
 *      AWS_ENDPOINT_URL_STS, else AWS_ENDPOINT_URL, else https://sts.REGION.amazonaws.com;
 *   3. the container endpoint (ECS task roles, EKS Pod Identity):
 *      AWS_CONTAINER_CREDENTIALS_FULL_URI, or http://169.254.170.2 +
 *      AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, sending the Authorization header read from
 *      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (else AWS_CONTAINER_AUTHORIZATION_TOKEN);
 *   4. EC2 instance metadata, IMDSv2 (a session token, then the role's credentials), at
 *      AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254; skipped when
 *      AWS_EC2_METADATA_DISABLED is true. Off EC2 this costs at most a 1 s connect timeout.
 * A source that is configured but fails (an unreadable token file, STS refusing the role)
 * is an error naming it, not a fall-through to the next.
 *
 * 2-4 give temporary credentials with an expiry: aws_creds_due says when to fetch them again
 * (5 minutes before it); a caller keeps the old ones while a refresh fails and they last.
 * Credentials never appear in error messages.
 */
#ifndef AWS_CREDS_H
#define AWS_CREDS_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

struct aws_creds {
	char *key, *secret, *token; /* malloc'd; token NULL for long-term keys */
	time_t expires;             /* 0: never */
	const char *source;         /* "environment", "web identity", "container", "instance
				     * metadata", "instance metadata (IMDSv1)" */
};

/* Fills *c from the first source that has credentials (region: the STS endpoint's, for web
 * identity). WK_OK, or WK_EINVAL (none anywhere, or a configured source failed: named),
 * WK_ENOMEM. *c is untouched on failure. */
int aws_creds_load(struct aws_creds *c, const char *region, char *err, size_t errsz);

/* Whether c should be fetched again at now: temporary credentials within 5 minutes of their
 * expiry. Never for credentials that do not expire. */
bool aws_creds_due(const struct aws_creds *c, time_t now);

/* Wipes and frees the strings; *c is zeroed. */
void aws_creds_free(struct aws_creds *c);

/* "2026-12-04T22:33:05Z" or with fractional seconds: seconds since the epoch (UTC); -1 when it
 * is not that shape. */
time_t aws_creds_parse_time(const char *s);

#endif
