/* Who may use the daemon: API tokens and the authentication settings.
 *
 * A token is "gj_<id>_<secret>": id is AUTH_ID_HEX lowercase hex digits, a public random name
 * by which the token is found; secret is AUTH_SECRET_BYTES random bytes from the OS
 * (libsodium's randombytes_buf) in lowercase hex. The store keeps the id, a BLAKE2b-256 hash of
 * the secret (libsodium's crypto_generichash), the token's label, its owner, its creation time,
 * an optional expiry and its last use; never the secret. A presented secret is hashed and
 * compared with sodium_memcmp, in constant time.
 *
 * The tokens live in their own SQLite file, STATE_DIR/auth.db (WAL), apart from the job store:
 * the admin's `gpujobd token` commands write it while the daemon runs and holds the job
 * store's lock. Every check reads the row anew, so that a revoked or expired token is refused
 * on its next request. A token's last use is written at most once per AUTH_LAST_USED_PERIOD_S.
 *
 * The settings ([auth] in the configuration) are one immutable auth_settings_t, built from the
 * configuration and held by pointer: a reload builds a new one and swaps the pointer. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/util/config.h"

#define AUTH_ID_HEX 12       /* hex digits of a token's public id */
#define AUTH_ID_SIZE 16      /* an id's buffer, NUL included */
#define AUTH_SECRET_BYTES 32 /* 256 bits */
#define AUTH_TOKEN_SIZE 96   /* "gj_" id "_" secret in hex, NUL included */
#define AUTH_NAME_SIZE 128   /* a token's label, NUL included */
#define AUTH_USER_SIZE 64    /* an owner's name, NUL included (the job store's OWNER_SIZE) */
#define AUTH_LAST_USED_PERIOD_S 60

/* --- tokens (auth_store.c) --- */

typedef struct auth_store auth_store_t;

/* What the store knows of a token: everything but its secret. Times in seconds since the
 * epoch; expires and last_used 0 for never. */
typedef struct auth_token_info {
    char id[AUTH_ID_SIZE];
    char name[AUTH_NAME_SIZE];
    char owner[AUTH_USER_SIZE];
    int64_t created, expires, last_used;
} auth_token_info_t;

/* Opens (creating when missing) STATE_DIR/auth.db. Thread-safe: one connection behind a
 * mutex, its statements prepared once. When the caller is root and creates the file, it is
 * given to the state directory's owner, so that the daemon's user can open it. 0 or a negative
 * errno, logged. */
int auth_store_open(const char *state_dir, auth_store_t **ret);
/* Accepts NULL. */
void auth_store_close(auth_store_t *st);

/* Makes a new token for owner, labelled name (both non-empty, printable, shorter than their
 * sizes), expiring at expires (0: never; else it must be in the future). The token's text, the
 * only copy of its secret there will ever be, goes to ret_token (AUTH_TOKEN_SIZE bytes); its
 * record to ret_info (NULL: not wanted). 0, -EINVAL for a bad argument, or another negative
 * errno, logged. */
int auth_token_create(auth_store_t *st, const char *owner, const char *name, int64_t expires,
                      auth_token_info_t *ret_info, char ret_token[AUTH_TOKEN_SIZE]);
/* Checks a presented token at time now (seconds): 0 and its record when it is well formed,
 * known, its secret matches and it has not expired; -EACCES otherwise (-EKEYEXPIRED when it
 * expired), or another negative errno when the store fails (logged). Records the use when the
 * last recorded one is AUTH_LAST_USED_PERIOD_S old. The token's text is never logged. */
int auth_token_check(auth_store_t *st, const char *token, int64_t now, auth_token_info_t *ret);
/* The tokens of owner (NULL: everyone's), oldest first: *ret (malloc'd, free it) and *ret_n. */
int auth_token_list(auth_store_t *st, const char *owner, auth_token_info_t **ret, size_t *ret_n);
/* Revokes token id if owner (NULL: any owner) owns it. 0, or -ENOENT when there is no such
 * token of that owner. */
int auth_token_revoke(auth_store_t *st, const char *id, const char *owner);

/* True when s has the shape of a token id. */
bool auth_token_id_valid(const char *s);
/* True when s is a usable owner or token name: non-empty, shorter than size, no control
 * characters. */
bool auth_name_valid(const char *s, size_t size);

/* --- settings (auth_settings.c) --- */

typedef struct auth_settings auth_settings_t;

/* Builds the settings of cfg ([auth] mode, admins, allow_users and allow_groups): 0, or
 * -EINVAL with the reason in err (a mode of none on a listener beyond loopback or with an
 * allow list, a bad admins or allow entry). */
int auth_settings_new(const config_t *cfg, auth_settings_t **ret, char *err, size_t err_size);
/* Accepts NULL. */
void auth_settings_free(auth_settings_t *s);

/* mode = none: no access control (every listener is loopback): a single-user workstation. */
bool auth_settings_open(const auth_settings_t *s);
/* Whether TCP requests (and, without peercred, Unix socket ones) may carry a Bearer token. */
bool auth_settings_tokens(const auth_settings_t *s);
/* Whether the kernel says who the user is (auth_peer_uid): the Unix socket's peer uid, and the
 * owner of a loopback TCP client's socket. */
bool auth_settings_peercred(const auth_settings_t *s);
/* Whether user is an admin: named in admins, or a member of a group named there as @group.
 * Uid 0, as the kernel names a peer, is an admin whatever the settings (decided by the
 * caller). The group answer is an NSS lookup, cached per user in s for a minute
 * (thread-safe): most requests cost none, and a membership change shows within a minute or at
 * a reload. */
bool auth_settings_is_admin(const auth_settings_t *s, const char *user);
/* Whether user may connect at all: true when allow_users and allow_groups are both empty,
 * when allow_users names user, when user is in a group of allow_groups (NSS, cached as
 * above), or when user is an admin. */
bool auth_settings_allows(const auth_settings_t *s, const char *user);
/* Why auth_settings_allows refuses user, as a sentence in why; returns the key that decided
 * ("auth.allow_users" or "auth.allow_groups"), a static string. */
const char *auth_settings_refusal(const auth_settings_t *s, const char *user, char *why,
                                  size_t why_size);
/* How many NSS group lookups s has made (what the cache did not answer), for tests. */
size_t auth_settings_group_lookups(const auth_settings_t *s);

/* --- the account behind a connection (auth_peer.c) --- */

/* The uid of the local account at the other end of connected socket fd, as the kernel knows
 * it: a Unix socket's SO_PEERCRED uid, or, for TCP over loopback (127.0.0.0/8, ::1, an IPv4
 * loopback address mapped into IPv6), the owner of the client's socket, found by its 4-tuple
 * through NETLINK_SOCK_DIAG (unprivileged). 0 and *ret_uid; -EREMOTE when the TCP peer is not
 * on a loopback address (only a token can say who it is); -ENOENT when the kernel knows no
 * such socket still open and connected (the client closed it); another negative errno when
 * the kernel could not be asked (a sandbox without AF_NETLINK, say). Never guesses. */
int auth_peer_uid(int fd, uid_t *ret_uid);

/* --- the admin's command line (auth_cli.c) --- */

/* `gpujobd token create|list|revoke ...`: argv[0] is "token". Reads --config and --state-dir
 * like the daemon, then acts on STATE_DIR/auth.db and prints the result. The process's exit
 * status: 0, 1 when the action failed, 2 for a usage error. */
int auth_cli_main(int argc, char **argv);
