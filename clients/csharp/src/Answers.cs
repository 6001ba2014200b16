// Matches the server's answers to the moves and actions the client sent. Every Move and
// Action gets exactly one answer carrying its client_time (its own Moved ack, an
// ActionDone, or an Error), and a player's answers come in the order its requests were
// sent. No I/O and no clock here: the client feeds answers in, on the thread that polls.
using System.Collections.Generic;
using System.Threading.Tasks;

namespace Meridian.Client
{
    /// <summary>The moves and actions sent and not yet answered, matched to their answers by client_time (used by <see cref="MeridianClient"/>; public for tools and tests).</summary>
    public sealed class AnswerBook
    {
        sealed class Pending
        {
            public ulong ClientTime;
            public bool IsMove;
            public TaskCompletionSource<Position> Move;
            public TaskCompletionSource<byte[]> Action;

            public void Fail(MeridianException error)
            {
                if (IsMove) Move.TrySetException(error);
                else Action.TrySetException(error);
            }
        }

        ulong nextClientTime = 1;
        // Send order; answers come in it, so the one answered is nearly always the first.
        readonly LinkedList<Pending> pending = new LinkedList<Pending>();
        readonly Dictionary<ulong, LinkedListNode<Pending>> byTime = new Dictionary<ulong, LinkedListNode<Pending>>();

        /// <summary>A fresh client_time: non-zero (proto3 does not send 0) and never reused.</summary>
        public ulong NextClientTime() { return nextClientTime++; }

        /// <summary>Requests sent and not yet answered.</summary>
        public int Count { get { return pending.Count; } }

        /// <summary>Whether a request with this client_time awaits its answer.</summary>
        public bool IsPending(ulong clientTime) { return byTime.ContainsKey(clientTime); }

        /// <summary>Registers a Move sent with <paramref name="clientTime"/>; the task completes with its ack's position.</summary>
        public Task<Position> ExpectMove(ulong clientTime)
        {
            var p = new Pending { ClientTime = clientTime, IsMove = true, Move = NewSource<Position>() };
            byTime[clientTime] = pending.AddLast(p);
            return p.Move.Task;
        }

        /// <summary>Registers an Action sent with <paramref name="clientTime"/>; the task completes with ActionDone.payload.</summary>
        public Task<byte[]> ExpectAction(ulong clientTime)
        {
            var p = new Pending { ClientTime = clientTime, Action = NewSource<byte[]>() };
            byTime[clientTime] = pending.AddLast(p);
            return p.Action.Task;
        }

        /// <summary>The player's own Moved ack. Returns a violation, or null.</summary>
        public string OnMoveAck(ulong clientTime, Position position)
        {
            Pending p;
            var violation = Take(clientTime, "move", out p);
            if (p != null) p.Move.TrySetResult(position);
            return violation;
        }

        /// <summary>An ActionDone. Returns a violation, or null.</summary>
        public string OnActionDone(ulong clientTime, byte[] payload)
        {
            Pending p;
            var violation = Take(clientTime, "action", out p);
            if (p != null) p.Action.TrySetResult(payload);
            return violation;
        }

        /// <summary>An Error carrying a client_time. <paramref name="matched"/> is false when it answers no request.</summary>
        public string OnError(MeridianException error, out bool matched)
        {
            matched = byTime.ContainsKey(error.ClientTime);
            if (!matched) return null;
            Pending p;
            var violation = Take(error.ClientTime, null, out p);
            p.Fail(error);
            return violation;
        }

        /// <summary>Fails every pending request with a local UNAVAILABLE (view reset, dropped connection, logout).</summary>
        public void FailAll(string detail)
        {
            var all = new List<Pending>(pending);
            pending.Clear();
            byTime.Clear();
            foreach (var p in all) p.Fail(new MeridianException(ErrorCode.UNAVAILABLE, detail, p.ClientTime, true));
        }

        string Take(ulong clientTime, string kind, out Pending taken)
        {
            taken = null;
            LinkedListNode<Pending> node;
            if (!byTime.TryGetValue(clientTime, out node))
            {
                return "answer for client_time " + clientTime + ", which is not pending";
            }
            if (kind != null && node.Value.IsMove != (kind == "move"))
            {
                return kind + " answer for client_time " + clientTime + ", which was " + (node.Value.IsMove ? "a move" : "an action");
            }
            // Answers come in send order: requests sent before this one will never be answered.
            int skipped = 0;
            while (pending.First != node)
            {
                var earlier = pending.First.Value;
                pending.RemoveFirst();
                byTime.Remove(earlier.ClientTime);
                earlier.Fail(new MeridianException(ErrorCode.UNAVAILABLE, "the server answered a later request first", earlier.ClientTime, true));
                skipped++;
            }
            pending.RemoveFirst();
            byTime.Remove(clientTime);
            taken = node.Value;
            return skipped == 0 ? null : "answer for client_time " + clientTime + " skipped " + skipped + " earlier request(s)";
        }

        // Continuations never run inside Poll(): an awaiting coroutine resumes on its own
        // SynchronizationContext (Unity's, Godot's main thread), not in the middle of the pump.
        static TaskCompletionSource<T> NewSource<T>()
        {
            return new TaskCompletionSource<T>(TaskCreationOptions.RunContinuationsAsynchronously);
        }
    }
}
