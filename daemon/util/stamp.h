/* Hand-off stamps of a job's path, for the benchmark build only (cmake -DGPUJOB_STAMPS=ON,
 * bench/handoff_stamps.sh): each STAMP(POINT) notes the monotonic time at which one request's
 * job passed POINT, from the HTTP thread that has its body to the answer queued. Without
 * GPUJOB_STAMPS every macro compiles to nothing, so that the hot path carries none of it.
 *
 * The stamps describe one request at a time (one client): STAMP_BEGIN() opens a new record
 * (and keeps the previous one), each point keeps its first stamp after the begin. At exit the
 * records are written as CSV, one line per request, microseconds since its begin, to the file
 * named by the environment variable GPUJOB_STAMPS_FILE. */
#pragma once

#ifdef GPUJOB_STAMPS

/* The points, in the order a waited job passes them (some may come in another order). */
#define STAMP_POINTS(X)                                                                            \
    X(BODY, "http: body in")                                                                       \
    X(PARSED, "http: parsed")                                                                      \
    X(POSTED, "http: posted to the loop")                                                          \
    X(LOOP_TAKEN, "loop: picked up")                                                               \
    X(DISPATCHED, "loop: handed to the executor")                                                  \
    X(INSERTED, "loop: insert committed")                                                          \
    X(SYNC_ASKED, "loop: sync requested")                                                          \
    X(EXEC_STARTED, "exec: started")                                                               \
    X(EXEC_DONE, "exec: done")                                                                     \
    X(DONE_POSTED, "exec: posted to the loop")                                                     \
    X(COMPLETION, "loop: completion picked up")                                                    \
    X(END_RECORDED, "loop: end committed")                                                         \
    X(SYNCED, "sync: acceptance synced")                                                           \
    X(REPLY, "reply called")                                                                       \
    X(RESUMED, "connection resumed")                                                               \
    X(ANSWERED, "http: answer queued")

typedef enum stamp_point {
#define STAMP_ENUM(name, text) STAMP_##name,
    STAMP_POINTS(STAMP_ENUM)
#undef STAMP_ENUM
        STAMP_N
} stamp_point_t;

void stamp_begin(void);
void stamp_mark(stamp_point_t p);

#define STAMP_BEGIN() stamp_begin()
#define STAMP(name) stamp_mark(STAMP_##name)

#else

#define STAMP_BEGIN() ((void)0)
#define STAMP(name) ((void)0)

#endif
