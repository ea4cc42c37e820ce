/* The round: everything the loop does for an event (its wake, a timer) runs here, in one fixed
 * order of phases, each a leaf that asks for later phases through s->want and s->ended rather
 * than calling them:
 *
 *   1. inbox     the messages other threads posted: finished batches join s->ended, the
 *                others go to their handlers; a message that looks at running jobs' ends
 *                (sees_ends) has the ends before it recorded first, with phase 2, and a
 *                handler that asks for a dispatch (a batch given back) has it, with phase
 *                4, before the next message, so that each given-back batch's jobs start
 *                again in a transaction of their own;
 *   2. complete  the ended batches' ends recorded, and a cut of what their freed slots (and
 *                any other room) can start, in one transaction (end_batches);
 *   3. commit    the group commit of the pending submissions and uploads, once due (no window
 *                or its timer has fired), with a cut of its own (commit_pending);
 *   4. dispatch  a cut, when one is still wanted: a batch was given back, the watchdog or a
 *                time limit freed a worker, a held batch's wait is over, a commit failed
 *                before its cut (end_batches without ends);
 *   5. timers    the deadline timer, when the earliest deadline changed, and the dispatch
 *                timer, when a cut held a partial batch back for company;
 *   6. drain     while stopping, the loop ends once no batch runs (stop_if_drained).
 *
 * Ends come before the commit so that the commit's cut sees the slots and running counts
 * they free. Any cut answers s->want.dispatch (round_cut), so phase 4 costs nothing after a
 * round that cut already. */
#include "sched_internal.h"

/* Whether handling m must see the batches that ended before it: a wait that answers at once
 * (no timeout, or the loop is stopping) must, a longer one is answered by their end anyway;
 * a submission or upload looks at no running job. */
static bool sees_ends(const sched_t *s, const msg_t *m)
{
    return m->kind != MSG_SUBMIT && m->kind != MSG_BUF_PUT &&
           (m->kind != MSG_WAIT || m->timeout_ms <= 0 || s->stopping);
}

/* Phase 2: the ends in s->ended, with the starts that follow them. */
static void round_complete(sched_t *s)
{
    if (!queue_empty(&s->ended)) end_batches(s, &s->ended, true);
}

/* Phase 4: a cut without ends, when one is wanted. */
static void round_dispatch(sched_t *s)
{
    if (s->want.dispatch) end_batches(s, NULL, true);
}

/* Phase 3: the group commit, when one is wanted and its window (commit_timer) is over. */
static void round_group_commit(sched_t *s)
{
    if (s->want.commit && !uv_is_active((uv_handle_t *)&s->commit_timer)) commit_pending(s);
}

/* The stop, within phase 1: what is pending is committed at once, without its window and
 * synced before the answer (s->stopping), and then the waiters are answered. */
static void round_stop(sched_t *s)
{
    s->stopping = true;
    uv_timer_stop(&s->commit_timer);
    round_group_commit(s);
    handle_stop(s);
}

/* Phase 1: the inbox's messages, in the order they came. */
static void round_inbox(sched_t *s)
{
    queue_t msgs;
    queue_init(&msgs);
    inbox_take(s, &msgs);
    for (queue_t *q; (q = queue_pop(&msgs));) {
        msg_t *m = queue_data(q, msg_t, node);
        if (batch_ended(s, m)) continue;
        if (sees_ends(s, m)) round_complete(s);
        if (m->kind == MSG_STOP) round_stop(s);
        handle_msg(s, m);
        round_dispatch(s);
    }
}

void sched_round(sched_t *s, bool inbox)
{
    if (inbox) round_inbox(s);
    round_complete(s);
    round_group_commit(s);
    round_dispatch(s);
    if (s->want.deadlines) deadline_arm(s);
    if (s->want.hold_until_us) dispatch_timer_arm(s);
    stop_if_drained(s);
}
