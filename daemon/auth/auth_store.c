/* The token store: STATE_DIR/auth.db, one SQLite connection behind a mutex with its statements
 * prepared once. The secret of a token is never stored: only a BLAKE2b-256 hash of it. */
#include "auth.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/util/log.h"

#define AUTH_HASH_BYTES crypto_generichash_BYTES /* 32 */
#define AUTH_BUSY_TIMEOUT_MS 5000
#define AUTH_CREATE_TRIES 4 /* fresh ids tried when one is taken */

enum {
    STMT_INSERT,
    STMT_FIND,
    STMT_TOUCH,
    STMT_LIST,
    STMT_REVOKE,
    STMT_COUNT,
};

static const char *const stmt_sql[STMT_COUNT] = {
    [STMT_INSERT] = "INSERT INTO tokens (id, hash, name, owner, created, expires, last_used) "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0)",
    [STMT_FIND] = "SELECT hash, name, owner, created, expires, last_used FROM tokens WHERE id = ?1",
    [STMT_TOUCH] = "UPDATE tokens SET last_used = ?2 WHERE id = ?1",
    [STMT_LIST] = "SELECT id, name, owner, created, expires, last_used FROM tokens "
                  "WHERE ?1 IS NULL OR owner = ?1 ORDER BY created, id",
    [STMT_REVOKE] = "DELETE FROM tokens WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
};

static const char schema_sql[] = "CREATE TABLE IF NOT EXISTS tokens ("
                                 " id TEXT PRIMARY KEY,"
                                 " hash BLOB NOT NULL,"
                                 " name TEXT NOT NULL,"
                                 " owner TEXT NOT NULL,"
                                 " created INTEGER NOT NULL,"
                                 " expires INTEGER NOT NULL DEFAULT 0,"
                                 " last_used INTEGER NOT NULL DEFAULT 0);"
                                 "CREATE INDEX IF NOT EXISTS tokens_owner ON tokens (owner);";

struct auth_store {
    pthread_mutex_t lock;
    sqlite3 *db;
    sqlite3_stmt *stmt[STMT_COUNT];
};

static int sqlite_errno(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return -EBUSY;
    case SQLITE_FULL:
        return -ENOSPC;
    case SQLITE_NOMEM:
        return -ENOMEM;
    case SQLITE_CONSTRAINT:
        return -EEXIST;
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
        return -EACCES;
    default:
        return -EIO;
    }
}

bool auth_name_valid(const char *s, size_t size)
{
    size_t len = s ? strnlen(s, size) : size;
    if (len == 0 || len >= size) return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return false;
    return true;
}

bool auth_token_id_valid(const char *s)
{
    if (!s || strlen(s) != AUTH_ID_HEX) return false;
    return strspn(s, "0123456789abcdef") == AUTH_ID_HEX;
}

/* The hash of a secret, the only form in which it is kept. */
static void secret_hash(const unsigned char *secret, unsigned char ret[AUTH_HASH_BYTES])
{
    crypto_generichash(ret, AUTH_HASH_BYTES, secret, AUTH_SECRET_BYTES, NULL, 0);
}

/* Splits "gj_<id>_<secret hex>" into its id and secret bytes. 0 or -EACCES. */
static int token_parse(const char *token, char ret_id[AUTH_ID_SIZE],
                       unsigned char ret_secret[AUTH_SECRET_BYTES])
{
    size_t len = strnlen(token, AUTH_TOKEN_SIZE);
    if (len != 3 + AUTH_ID_HEX + 1 + 2 * AUTH_SECRET_BYTES || strncmp(token, "gj_", 3) != 0 ||
        token[3 + AUTH_ID_HEX] != '_')
        return -EACCES;
    char id[AUTH_ID_SIZE];
    memcpy(id, token + 3, AUTH_ID_HEX);
    id[AUTH_ID_HEX] = '\0';
    const char *hex = token + 3 + AUTH_ID_HEX + 1;
    size_t n = 0;
    if (!auth_token_id_valid(id) || strspn(hex, "0123456789abcdef") != 2 * AUTH_SECRET_BYTES ||
        sodium_hex2bin(ret_secret, AUTH_SECRET_BYTES, hex, 2 * AUTH_SECRET_BYTES, NULL, &n, NULL) !=
            0 ||
        n != AUTH_SECRET_BYTES)
        return -EACCES;
    memcpy(ret_id, id, AUTH_ID_SIZE);
    return 0;
}

/* A file the store made as root belongs to the state directory's owner, who runs the daemon. */
static void give_to_state_dir_owner(const char *state_dir, const char *db_path)
{
    struct stat dir;
    if (geteuid() != 0 || stat(state_dir, &dir) < 0 || dir.st_uid == 0) return;
    static const char *const suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        char path[PATH_MAX + 8];
        snprintf(path, sizeof path, "%s%s", db_path, suffixes[i]);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
            chown(path, dir.st_uid, dir.st_gid) < 0)
            log_warn("Failed to give '%s' to uid %u: %s", path, (unsigned)dir.st_uid,
                     strerror(errno));
    }
}

static int store_prepare(auth_store_t *st, const char *path)
{
    char *msg = NULL;
    int rc = sqlite3_busy_timeout(st->db, AUTH_BUSY_TIMEOUT_MS);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(st->db,
                          "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"
                          "PRAGMA foreign_keys = OFF;",
                          NULL, NULL, &msg);
    if (rc == SQLITE_OK) rc = sqlite3_exec(st->db, schema_sql, NULL, NULL, &msg);
    for (int i = 0; rc == SQLITE_OK && i < STMT_COUNT; i++)
        rc = sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[i],
                                NULL);
    if (rc != SQLITE_OK) {
        int r = sqlite_errno(rc);
        log_error("Failed to open the token store '%s': %s", path,
                  msg ? msg : sqlite3_errmsg(st->db));
        sqlite3_free(msg);
        return r;
    }
    return 0;
}

int auth_store_open(const char *state_dir, auth_store_t **ret)
{
    if (sodium_init() < 0) return log_error_errno(-EIO, "Failed to initialise libsodium");
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/auth.db", state_dir) >= (int)sizeof path)
        return log_error_errno(-ENAMETOOLONG, "State directory '%s' is too long", state_dir);
    auth_store_t *st = calloc(1, sizeof *st);
    if (!st) return -ENOMEM;
    pthread_mutex_init(&st->lock, NULL);
    int rc = sqlite3_open_v2(
        path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    int r = 0;
    if (rc != SQLITE_OK) {
        r = sqlite_errno(rc);
        log_error("Failed to open the token store '%s': %s", path,
                  st->db ? sqlite3_errmsg(st->db) : "out of memory");
    } else {
        r = store_prepare(st, path);
    }
    if (r < 0) {
        auth_store_close(st);
        return r;
    }
    give_to_state_dir_owner(state_dir, path);
    *ret = st;
    return 0;
}

void auth_store_close(auth_store_t *st)
{
    if (!st) return;
    for (int i = 0; i < STMT_COUNT; i++)
        sqlite3_finalize(st->stmt[i]);
    sqlite3_close(st->db);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

/* Runs a statement that returns no rows, then resets it. Lock held. */
static int stmt_run(auth_store_t *st, sqlite3_stmt *s)
{
    int rc = sqlite3_step(s);
    int r = rc == SQLITE_DONE ? 0 : sqlite_errno(rc);
    if (r < 0 && r != -EEXIST) log_error("Token store: %s", sqlite3_errmsg(st->db));
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return r;
}

/* A token's record from a row whose columns from `first` on are name, owner, created,
 * expires, last_used. */
static void info_from_row(sqlite3_stmt *s, int first, auth_token_info_t *info)
{
    snprintf(info->name, sizeof info->name, "%s", (const char *)sqlite3_column_text(s, first));
    snprintf(info->owner, sizeof info->owner, "%s",
             (const char *)sqlite3_column_text(s, first + 1));
    info->created = sqlite3_column_int64(s, first + 2);
    info->expires = sqlite3_column_int64(s, first + 3);
    info->last_used = sqlite3_column_int64(s, first + 4);
}

/* Inserts a token of a fresh id and secret; -EEXIST when the id was taken. Lock held. */
static int token_insert(auth_store_t *st, const auth_token_info_t *info,
                        const unsigned char secret[AUTH_SECRET_BYTES])
{
    unsigned char hash[AUTH_HASH_BYTES];
    secret_hash(secret, hash);
    sqlite3_stmt *s = st->stmt[STMT_INSERT];
    sqlite3_bind_text(s, 1, info->id, -1, SQLITE_STATIC);
    sqlite3_bind_blob(s, 2, hash, sizeof hash, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, info->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, info->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, info->created);
    sqlite3_bind_int64(s, 6, info->expires);
    return stmt_run(st, s);
}

int auth_token_create(auth_store_t *st, const char *owner, const char *name, int64_t expires,
                      auth_token_info_t *ret_info, char ret_token[AUTH_TOKEN_SIZE])
{
    if (!auth_name_valid(owner, AUTH_USER_SIZE) || !auth_name_valid(name, AUTH_NAME_SIZE) ||
        expires < 0)
        return -EINVAL;
    auth_token_info_t info = {.created = (int64_t)time(NULL), .expires = expires};
    if (expires && expires <= info.created) return -EINVAL;
    snprintf(info.owner, sizeof info.owner, "%s", owner);
    snprintf(info.name, sizeof info.name, "%s", name);
    unsigned char secret[AUTH_SECRET_BYTES];
    int r = -EEXIST;
    pthread_mutex_lock(&st->lock);
    for (int tries = 0; r == -EEXIST && tries < AUTH_CREATE_TRIES; tries++) {
        unsigned char id_bytes[AUTH_ID_HEX / 2];
        randombytes_buf(id_bytes, sizeof id_bytes);
        sodium_bin2hex(info.id, sizeof info.id, id_bytes, sizeof id_bytes);
        randombytes_buf(secret, sizeof secret);
        r = token_insert(st, &info, secret);
    }
    pthread_mutex_unlock(&st->lock);
    if (r == 0) {
        char hex[2 * AUTH_SECRET_BYTES + 1];
        sodium_bin2hex(hex, sizeof hex, secret, sizeof secret);
        snprintf(ret_token, AUTH_TOKEN_SIZE, "gj_%s_%s", info.id, hex);
        sodium_memzero(hex, sizeof hex);
        if (ret_info) *ret_info = info;
    }
    sodium_memzero(secret, sizeof secret);
    return r;
}

/* Records a use at now when the last recorded one is a period old. Lock held. */
static void token_touch(auth_store_t *st, const char *id, int64_t last_used, int64_t now)
{
    if (now - last_used < AUTH_LAST_USED_PERIOD_S) return;
    sqlite3_stmt *s = st->stmt[STMT_TOUCH];
    sqlite3_bind_text(s, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, now);
    /* A failure costs only the record of the use: the request goes on. */
    (void)stmt_run(st, s);
}

int auth_token_check(auth_store_t *st, const char *token, int64_t now, auth_token_info_t *ret)
{
    char id[AUTH_ID_SIZE];
    unsigned char secret[AUTH_SECRET_BYTES], hash[AUTH_HASH_BYTES];
    if (!token || token_parse(token, id, secret) < 0) return -EACCES;
    secret_hash(secret, hash);
    sodium_memzero(secret, sizeof secret);
    auth_token_info_t info = {0};
    pthread_mutex_lock(&st->lock);
    sqlite3_stmt *s = st->stmt[STMT_FIND];
    sqlite3_bind_text(s, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s), r = -EACCES;
    if (rc == SQLITE_ROW) {
        const void *stored = sqlite3_column_blob(s, 0);
        bool match = stored && sqlite3_column_bytes(s, 0) == AUTH_HASH_BYTES &&
                     sodium_memcmp(stored, hash, AUTH_HASH_BYTES) == 0;
        info_from_row(s, 1, &info);
        if (match) r = info.expires && info.expires <= now ? -EKEYEXPIRED : 0;
    } else if (rc != SQLITE_DONE) {
        r = sqlite_errno(rc);
        log_error("Token store: %s", sqlite3_errmsg(st->db));
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (r == 0) {
        token_touch(st, id, info.last_used, now);
        snprintf(info.id, sizeof info.id, "%s", id);
    }
    pthread_mutex_unlock(&st->lock);
    if (r == 0) *ret = info;
    return r;
}

int auth_token_list(auth_store_t *st, const char *owner, auth_token_info_t **ret, size_t *ret_n)
{
    auth_token_info_t *list = NULL;
    size_t n = 0, cap = 0;
    int r = 0, rc;
    pthread_mutex_lock(&st->lock);
    sqlite3_stmt *s = st->stmt[STMT_LIST];
    if (owner) sqlite3_bind_text(s, 1, owner, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            auth_token_info_t *grown = realloc(list, cap * sizeof *list);
            if (!grown) {
                r = -ENOMEM;
                break;
            }
            list = grown;
        }
        auth_token_info_t *info = &list[n++];
        memset(info, 0, sizeof *info);
        snprintf(info->id, sizeof info->id, "%s", (const char *)sqlite3_column_text(s, 0));
        info_from_row(s, 1, info);
    }
    if (r == 0 && rc != SQLITE_DONE) {
        r = sqlite_errno(rc);
        log_error("Token store: %s", sqlite3_errmsg(st->db));
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    pthread_mutex_unlock(&st->lock);
    if (r < 0) {
        free(list);
        return r;
    }
    *ret = list;
    *ret_n = n;
    return 0;
}

int auth_token_revoke(auth_store_t *st, const char *id, const char *owner)
{
    if (!auth_token_id_valid(id)) return -ENOENT;
    pthread_mutex_lock(&st->lock);
    sqlite3_stmt *s = st->stmt[STMT_REVOKE];
    sqlite3_bind_text(s, 1, id, -1, SQLITE_STATIC);
    if (owner) sqlite3_bind_text(s, 2, owner, -1, SQLITE_STATIC);
    int r = stmt_run(st, s);
    if (r == 0 && sqlite3_changes(st->db) == 0) r = -ENOENT;
    pthread_mutex_unlock(&st->lock);
    return r;
}
