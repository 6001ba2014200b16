// Framing, the view model and the answer book, without any socket.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading.Tasks;

namespace Meridian.Client.Tests
{
    public static class FramingTests
    {
        [Test]
        public static void Frames_round_trip_whatever_the_chunking()
        {
            var random = new Random(7);
            var bodies = Enumerable.Range(0, 50).Select(i => { var b = new byte[random.Next(0, 4097)]; random.NextBytes(b); return b; }).ToList();
            var stream = bodies.SelectMany(b => Framing.EncodeFrame(b)).ToArray();
            foreach (int chunk in new[] { 1, 3, 127, 128, 4096, stream.Length })
            {
                var decoder = new FrameDecoder();
                var read = new List<byte[]>();
                for (int at = 0; at < stream.Length; at += chunk)
                {
                    decoder.Push(stream, at, Math.Min(chunk, stream.Length - at));
                    byte[] body;
                    while ((body = decoder.Next()) != null) read.Add(body);
                }
                Assert.Equal(bodies.Count, read.Count, "bodies read in chunks of " + chunk);
                Assert.True(bodies.Zip(read, (a, b) => a.SequenceEqual(b)).All(x => x), "the same bodies in chunks of " + chunk);
                Assert.Equal(0, decoder.Buffered, "nothing left over");
            }
        }

        [Test]
        public static void The_limit_is_4096_and_4097_is_refused_from_the_prefix_alone()
        {
            var decoder = new FrameDecoder();
            decoder.Push(new byte[] { 0x80, 0x20 }, 0, 2); // 4096
            Assert.True(decoder.Next() == null, "4096 waits for its body");
            var refusing = new FrameDecoder();
            refusing.Push(new byte[] { 0x81, 0x20 }, 0, 2); // 4097, no body at all
            var error = Assert.Throws<FrameException>(() => refusing.Next(), "4097");
            Assert.True(error.TooLarge, "too large");
            Assert.Throws<FrameException>(() => refusing.Next(), "and for good");
            Assert.Throws<FrameException>(() => Framing.EncodeFrame(new byte[4097]), "not sent either");
            Assert.Equal(4098, Framing.EncodeFrame(new byte[4096]).Length, "a 4096 body has a 2-byte prefix");
            var endless = new FrameDecoder(int.MaxValue);
            endless.Push(Enumerable.Repeat((byte)0x80, 11).ToArray(), 0, 11);
            Assert.Throws<FrameException>(() => endless.Next(), "an 11-byte prefix");
            var empty = new FrameDecoder();
            empty.Push(new byte[] { 0 }, 0, 1);
            Assert.Equal(0, empty.Next().Length, "an empty body is a frame");
        }
    }

    public static class ViewTests
    {
        static View Started(out List<string> log)
        {
            var view = new View();
            var events = new List<string>();
            log = events;
            view.EntityEntered += e => events.Add("entered " + e.Id + " " + e.Name + " " + e.Position);
            view.EntityMoved += (e, from) => events.Add("moved " + e.Id + " " + from + "->" + e.Position);
            view.EntityLeft += e => events.Add("left " + e.Id);
            view.StateChanged += (e, old) => events.Add("state " + e.Id + " " + System.Text.Encoding.UTF8.GetString(e.State));
            view.GameEvent += (source, kind, payload) => events.Add("event " + source + " " + kind);
            view.Chat += (from, text, sender) => events.Add("chat " + from + " " + text + " " + (sender == null ? "-" : sender.Name));
            view.Reset += p => events.Add("reset " + p);
            view.Violation += v => events.Add("violation " + v.Description);
            view.Start(new WorldInfo { PlayerId = 1, Name = "me", Position = new Position(10, 10), MapWidth = 400, MapHeight = 400, ViewRange = 20 });
            return view;
        }

        [Test]
        public static void The_view_follows_entered_moved_left_state_and_reset()
        {
            List<string> log;
            var view = Started(out log);
            view.Apply(new Entered { PlayerId = 2, Name = "bob", Position = new Position(12, 10) });
            view.Apply(new Entered { PlayerId = 3, Name = "wolf", Position = new Position(9, 9), Kind = 1, State = System.Text.Encoding.UTF8.GetBytes("{\"hp\":10}") });
            view.Apply(new Moved { PlayerId = 2, Position = new Position(13, 10) });
            view.Apply(new Moved { PlayerId = 1, Position = new Position(11, 10), ClientTime = 5 });
            view.Apply(new StateChanged { EntityId = 3, State = System.Text.Encoding.UTF8.GetBytes("{\"hp\":6}") });
            view.Apply(new ChatMessage { PlayerId = 2, Text = "hi" });
            view.Apply(new ChatMessage { PlayerId = 9, Text = "far" });
            view.Apply(new GameEvent { Source = 3, Kind = 1, Payload = new byte[] { 2 } });
            view.Apply(new Left { PlayerId = 2 });
            Assert.Equal(new Position(11, 10), view.Self.Position, "self moved");
            Assert.True(view.Get(2) == null && view.Get(3).Kind == 1 && !view.Get(3).IsPlayer, "bob gone, the wolf an NPC");
            Assert.Equal(1, view.Entities.Count, "one in sight");
            Assert.True(view.Find("wolf") != null && view.Find("bob") == null, "find by name");
            view.Apply(new ViewReset { PlayerId = 1, Position = new Position(30, 30) });
            Assert.Equal(0, view.Entities.Count, "the reset forgets everything");
            Assert.Equal(new Position(30, 30), view.Self.Position, "and moves self");
            var expected = new[]
            {
                "entered 2 bob (12, 10)", "entered 3 wolf (9, 9)", "moved 2 (12, 10)->(13, 10)", "moved 1 (10, 10)->(11, 10)",
                "state 3 {\"hp\":6}", "chat 2 hi bob", "chat 9 far -", "event 3 1", "left 2", "reset (30, 30)",
            };
            Assert.Equal(string.Join(" | ", expected), string.Join(" | ", log), "events");
        }

        [Test]
        public static void Protocol_violations_are_reported_not_thrown()
        {
            List<string> log;
            var view = Started(out log);
            view.Apply(new Moved { PlayerId = 7, Position = new Position(1, 1) });
            view.Apply(new Left { PlayerId = 7 });
            view.Apply(new StateChanged { EntityId = 7 });
            view.Apply(new Entered { PlayerId = 1, Name = "me again" });
            view.Apply(new Entered { PlayerId = 4, Name = "x" });
            view.Apply(new Entered { PlayerId = 4, Name = "x2" });
            view.Apply(new ViewReset { PlayerId = 99, Position = new Position(1, 2) });
            Assert.Equal(6, log.Count(l => l.StartsWith("violation")), "violations: " + string.Join(" | ", log));
            Assert.Equal(new Position(1, 2), view.Self.Position, "a wrong-player reset is still applied");
        }
    }

    public static class AnswerTests
    {
        [Test]
        public static void Answers_settle_their_own_request_in_order()
        {
            var book = new AnswerBook();
            var t1 = book.NextClientTime();
            var t2 = book.NextClientTime();
            var t3 = book.NextClientTime();
            Assert.True(t1 != 0 && t1 < t2 && t2 < t3, "non-zero, increasing");
            var move1 = book.ExpectMove(t1);
            var action2 = book.ExpectAction(t2);
            var move3 = book.ExpectMove(t3);
            Assert.True(book.OnMoveAck(t1, new Position(4, 5)) == null, "a clean ack");
            bool matched;
            Assert.True(book.OnError(new MeridianException(ErrorCode.REJECTED, "no", t2), out matched) == null && matched, "a clean refusal");
            Assert.Equal(new Position(4, 5), move1.Result, "the ack's position");
            var refusal = Assert.Throws<MeridianException>(() => action2.Wait(), "the action's error");
            Assert.Equal(ErrorCode.REJECTED, refusal.Code, "REJECTED, typed");
            Assert.True(book.OnError(new MeridianException(ErrorCode.RATE_LIMITED, "x", 77), out matched) == null && !matched, "an error for nothing pending");
            Assert.True(book.OnActionDone(t3, new byte[0]) != null, "an action answer for a move is a violation");
            Assert.Equal(1, book.Count, "the move is still pending");
            book.FailAll("dropped");
            var dropped = Assert.Throws<MeridianException>(() => move3.Wait(), "failed on drop");
            Assert.True(dropped.Local && dropped.Code == ErrorCode.UNAVAILABLE && dropped.ClientTime == t3, "local UNAVAILABLE with its client_time");
        }

        [Test]
        public static void A_later_answer_fails_the_earlier_requests()
        {
            var book = new AnswerBook();
            var tasks = Enumerable.Range(0, 3).Select(_ => book.ExpectMove(book.NextClientTime())).ToList();
            Assert.True(book.OnMoveAck(3, new Position(1, 1)) != null, "skipping two is a violation");
            Assert.True(tasks[0].IsFaulted && tasks[1].IsFaulted && tasks[2].Status == TaskStatus.RanToCompletion, "the earlier two failed");
            Assert.Equal(0, book.Count, "nothing left");
            Assert.True(book.OnMoveAck(1, new Position(1, 1)) != null, "an answer to nothing pending is a violation");
        }
    }
}
