// The client against fake gateways in this process (loopback TCP, port 0): the parts of
// the session that a real cluster makes slow or hard to provoke (pacing, keep-alive, a
// gateway that says SHUTTING_DOWN, REPLACED, oversize frames).
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Net;
using System.Net.Sockets;
using System.Threading;

namespace Meridian.Client.Tests
{
    public sealed class FakeConnection
    {
        readonly Socket socket;
        readonly object sendLock = new object();
        public readonly List<KeyValuePair<double, ClientMessage>> Received = new List<KeyValuePair<double, ClientMessage>>();

        public FakeConnection(Socket socket) { this.socket = socket; }

        public void Send(ServerMessage message) { SendRaw(Framing.EncodeFrame(Codec.EncodeServer(message))); }

        public void SendRaw(byte[] bytes)
        {
            lock (sendLock)
            {
                try { socket.Send(bytes); } catch (Exception) { }
            }
        }

        public void Close()
        {
            try { socket.Shutdown(SocketShutdown.Both); } catch (Exception) { }
            socket.Close();
        }

        public List<ClientMessage> Messages()
        {
            lock (Received) return Received.Select(kv => kv.Value).ToList();
        }
    }

    /// <summary>A gateway that speaks just enough of the protocol, with a hook to change what it says.</summary>
    public sealed class FakeGateway : IDisposable
    {
        readonly TcpListener listener = new TcpListener(IPAddress.Loopback, 0);
        readonly Stopwatch clock = Stopwatch.StartNew();
        public readonly BlockingCollection<FakeConnection> Accepted = new BlockingCollection<FakeConnection>();
        /// <summary>Return true when the message was handled; otherwise the default answer is sent.</summary>
        public Func<FakeConnection, ClientMessage, bool> Hook = (c, m) => false;
        public string TokenPrefix = "t";
        int tokens;
        /// <summary>Where the player is on this gateway (a resume comes back here).</summary>
        public Position position = new Position(5, 5);
        public int AcceptedCount;

        public FakeGateway()
        {
            listener.Start();
            new Thread(AcceptLoop) { IsBackground = true }.Start();
        }

        public string Address { get { return "127.0.0.1:" + ((IPEndPoint)listener.LocalEndpoint).Port; } }

        void AcceptLoop()
        {
            while (true)
            {
                Socket socket;
                try { socket = listener.AcceptSocket(); } catch (Exception) { return; }
                var connection = new FakeConnection(socket);
                Interlocked.Increment(ref AcceptedCount);
                Accepted.Add(connection);
                new Thread(() => Serve(socket, connection)) { IsBackground = true }.Start();
            }
        }

        void Serve(Socket socket, FakeConnection connection)
        {
            var decoder = new FrameDecoder();
            var buffer = new byte[4096];
            try
            {
                while (true)
                {
                    int n = socket.Receive(buffer);
                    if (n == 0) break;
                    decoder.Push(buffer, 0, n);
                    byte[] body;
                    while ((body = decoder.Next()) != null)
                    {
                        var message = Codec.DecodeClient(body);
                        lock (connection.Received) connection.Received.Add(new KeyValuePair<double, ClientMessage>(clock.Elapsed.TotalSeconds, message));
                        if (!Hook(connection, message)) Answer(connection, message);
                    }
                }
            }
            catch (Exception)
            {
            }
            connection.Close();
        }

        void Answer(FakeConnection c, ClientMessage message)
        {
            if (message is Login login)
            {
                position = login.Spawn ?? position;
                c.Send(new LoginOk { PlayerId = 1, Position = position, ResumeToken = Token(), MapWidth = 400, MapHeight = 400, ViewRange = 20 });
            }
            else if (message is Resume)
            {
                c.Send(new ViewReset { PlayerId = 1, Position = position, ResumeToken = Token() });
            }
            else if (message is Move move)
            {
                position = new Position(position.X + (move.Direction == Direction.RIGHT ? 1u : 0u), position.Y);
                c.Send(new Moved { PlayerId = 1, Position = position, ClientTime = move.ClientTime });
            }
            else if (message is Ping ping)
            {
                c.Send(new Pong { ClientTime = ping.ClientTime });
            }
            else if (message is ActionRequest action)
            {
                c.Send(new ActionDone { ClientTime = action.ClientTime, Payload = action.Payload });
            }
            else if (message is Logout)
            {
                c.Close();
            }
        }

        byte[] Token() { return System.Text.Encoding.ASCII.GetBytes(TokenPrefix + Interlocked.Increment(ref tokens)); }

        public void Dispose() { listener.Stop(); }
    }

    public static class ClientTests
    {
        static readonly TimeSpan Wait = TimeSpan.FromSeconds(10);

        [Test]
        public static void Login_move_action_and_a_typed_refusal()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(gateway.Address))
            {
                gateway.Hook = (c, m) =>
                {
                    var action = m as ActionRequest;
                    if (action == null || action.Kind != 9) return false;
                    c.Send(new ErrorMessage { Code = ErrorCode.REJECTED, Detail = "no such thing", ClientTime = action.ClientTime });
                    return true;
                };
                var info = client.Wait(client.LoginAsync("alice", new Position(7, 7)), Wait);
                Assert.True(info.PlayerId == 1 && info.Position == new Position(7, 7) && info.World.ViewRange == 20, "LoginOk");
                Assert.Equal(ClientState.Playing, client.State, "playing");
                Assert.Equal(new Position(8, 7), client.Wait(client.MoveAsync(Direction.RIGHT), Wait), "the ack");
                Assert.Equal(new Position(8, 7), client.View.Self.Position, "the view moved first");
                var payload = client.Wait(client.ActionAsync(1, 5, new byte[] { 42 }), Wait);
                Assert.True(payload.Length == 1 && payload[0] == 42, "ActionDone's payload");
                var refused = Assert.Throws<MeridianException>(() => client.Wait(client.ActionAsync(9), Wait), "REJECTED");
                Assert.True(refused.Code == ErrorCode.REJECTED && refused.Detail == "no such thing" && !refused.Local, "typed: " + refused);
                var tooBig = Assert.Throws<MeridianException>(() => client.Wait(client.ActionAsync(1, 0, new byte[5000]), Wait), "a frame over the limit");
                Assert.True(tooBig.Code == ErrorCode.FRAME_TOO_LARGE && tooBig.Local, "refused before sending");
                client.Wait(client.LogoutAsync(), Wait);
                Assert.Equal(ClientState.Closed, client.State, "closed after logout");
                var sent = gateway.Accepted.Take().Messages();
                Assert.True(sent.Last() is Logout, "the Logout was sent: " + string.Join(",", sent.Select(s => s.GetType().Name)));
            }
        }

        [Test]
        public static void Moves_are_paced_under_the_server_limit_and_all_acked_in_order()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(gateway.Address))
            {
                client.Wait(client.LoginAsync("pacer", new Position(0, 0)), Wait);
                var moves = Enumerable.Range(0, 40).Select(_ => client.MoveAsync(Direction.RIGHT)).ToList();
                Assert.True(client.PollUntil(() => moves.All(m => m.IsCompleted), Wait), "all 40 answered");
                var positions = moves.Select(m => m.Result.X).ToList();
                Assert.True(positions.SequenceEqual(Enumerable.Range(1, 40).Select(i => (uint)i)), "in order: " + string.Join(",", positions));
                var times = gateway.Accepted.Take().Received.Where(kv => kv.Value is Move).Select(kv => kv.Key).ToList();
                // The server's bucket (20 a second, burst 20) run over the arrival times refuses none.
                double tokens = 20, last = times[0];
                foreach (var t in times)
                {
                    tokens = Math.Min(20, tokens + (t - last) * 20);
                    last = t;
                    Assert.True(tokens >= 1, "the server would refuse the move at " + t);
                    tokens -= 1;
                }
                Assert.True(times.Last() - times.First() > 1.0, "40 moves take more than a second");
            }
        }

        [Test]
        public static void Unpaced_moves_go_at_once()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(new ClientOptions { Gateways = { gateway.Address }, PaceToLimits = false }))
            {
                client.Wait(client.LoginAsync("hasty"), Wait);
                var moves = Enumerable.Range(0, 40).Select(_ => client.MoveAsync(Direction.RIGHT)).ToList();
                Assert.True(client.PollUntil(() => moves.All(m => m.IsCompleted), Wait), "all answered");
                var times = gateway.Accepted.Take().Received.Where(kv => kv.Value is Move).Select(kv => kv.Key).ToList();
                Assert.True(times.Last() - times.First() < 0.9, "sent together: " + (times.Last() - times.First()) + " s");
            }
        }

        [Test]
        public static void No_more_than_max_in_flight_requests_are_outstanding()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(new ClientOptions { Gateways = { gateway.Address }, MaxInFlight = 5 }))
            {
                var held = new List<Move>();
                FakeConnection connection = null;
                gateway.Hook = (c, m) =>
                {
                    var move = m as Move;
                    if (move == null) return false;
                    lock (held) { held.Add(move); connection = c; }
                    return true;
                };
                client.Wait(client.LoginAsync("patient"), Wait);
                var moves = Enumerable.Range(0, 12).Select(_ => client.MoveAsync(Direction.DOWN)).ToList();
                Func<int> heldCount = () => { lock (held) return held.Count; };
                Assert.True(client.PollUntil(() => heldCount() == 5, Wait), "five sent");
                // Nothing more goes while five are unanswered (a bounded look, not a wait for an event).
                client.PollUntil(() => heldCount() > 5, TimeSpan.FromMilliseconds(300));
                Assert.Equal(5, heldCount(), "still five in flight");
                Assert.Equal(12, client.Pending, "twelve pending in all");
                gateway.Hook = (c, m) => false;
                lock (held)
                {
                    foreach (var move in held) connection.Send(new Moved { PlayerId = 1, Position = new Position(5, 6), ClientTime = move.ClientTime });
                }
                Assert.True(client.PollUntil(() => moves.All(m => m.IsCompleted), Wait), "all twelve answered once the first five were");
                Assert.True(moves.All(m => m.Status == System.Threading.Tasks.TaskStatus.RanToCompletion), "and none failed");
            }
        }

        [Test]
        public static void Every_error_code_reaches_the_app_typed()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(new ClientOptions { Gateways = { gateway.Address }, PaceToLimits = false }))
            {
                var codes = Enum.GetValues(typeof(ErrorCode)).Cast<ErrorCode>().ToList();
                int next = 0;
                gateway.Hook = (c, m) =>
                {
                    var action = m as ActionRequest;
                    if (action == null) return false;
                    var code = codes[Interlocked.Increment(ref next) - 1];
                    c.Send(new ErrorMessage { Code = code, Detail = "detail " + code, ClientTime = action.ClientTime });
                    return true;
                };
                var events = new List<MeridianException>();
                client.Error += events.Add;
                client.Wait(client.LoginAsync("errors"), Wait);
                foreach (var code in codes)
                {
                    var error = Assert.Throws<MeridianException>(() => client.Wait(client.ActionAsync(1), Wait), code.ToString());
                    Assert.True(error.Code == code && error.Detail == "detail " + code && !error.Local, "typed as " + code + ": " + error);
                    Assert.Equal(code.ToString(), error.CodeName, "the code's name");
                }
                // An error that answers nothing pending is an Error event, typed the same way.
                gateway.Accepted.Take().Send(new ErrorMessage { Code = ErrorCode.INVALID_ARGUMENT, Detail = "chat too long" });
                Assert.True(client.PollUntil(() => events.Count == 1, Wait), "the Error event");
                Assert.Equal(ErrorCode.INVALID_ARGUMENT, events[0].Code, "typed");
                Assert.True(new MeridianException((ErrorCode)99, "x").CodeName == "UNKNOWN_99", "a code from a newer server has a name too");
            }
        }

        [Test]
        public static void A_quiet_client_pings()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(new ClientOptions { Gateways = { gateway.Address }, KeepAlive = TimeSpan.FromMilliseconds(100) }))
            {
                int pongs = 0;
                client.Pong += (time, rtt) => pongs++;
                client.Wait(client.LoginAsync("quiet"), Wait);
                Assert.True(client.PollUntil(() => pongs >= 2, Wait), "two keep-alive pongs");
            }
        }

        [Test]
        public static void Shutting_down_moves_the_client_to_the_next_gateway_with_its_token()
        {
            using (var first = new FakeGateway { TokenPrefix = "first" })
            using (var second = new FakeGateway { TokenPrefix = "second", position = new Position(3, 3) })
            using (var client = new MeridianClient(first.Address, second.Address))
            {
                var events = new List<string>();
                client.Resuming += reason => events.Add("resuming");
                client.Resumed += (position, attempts, gateway) => events.Add("resumed " + gateway);
                client.View.Reset += position => events.Add("reset " + position);
                client.Wait(client.LoginAsync("mover", new Position(3, 3)), Wait);
                var connection = first.Accepted.Take();
                // A move the gateway never answers: it is failed locally by the drop.
                first.Hook = (c, m) => m is Move;
                var lost = client.MoveAsync(Direction.RIGHT);
                Assert.True(client.PollUntil(() => connection.Messages().Any(m => m is Move), Wait), "the move reached the first gateway");
                connection.Send(new ErrorMessage { Code = ErrorCode.SHUTTING_DOWN, Detail = "gateway draining" });
                connection.Close();
                Assert.True(client.PollUntil(() => client.Resumes == 1, Wait), "resumed");
                var dropped = Assert.Throws<MeridianException>(() => lost.Wait(), "the unanswered move");
                Assert.True(dropped.Local && dropped.Code == ErrorCode.UNAVAILABLE, "failed locally: " + dropped);
                Assert.Equal("resuming | reset (3, 3) | resumed " + second.Address, string.Join(" | ", events), "events");
                var resume = (Resume)second.Accepted.Take().Messages().First();
                Assert.Equal("first1", System.Text.Encoding.ASCII.GetString(resume.Token), "the LoginOk token");
                Assert.Equal("second1", System.Text.Encoding.ASCII.GetString(client.Info.ResumeToken), "the ViewReset's fresh token is kept");
                Assert.Equal(new Position(4, 3), client.Wait(client.MoveAsync(Direction.RIGHT), Wait), "playing on the second gateway");
            }
        }

        [Test]
        public static void A_refused_login_leaves_the_connection_open_for_another_try()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(gateway.Address))
            {
                gateway.Hook = (c, m) =>
                {
                    var login = m as Login;
                    if (login == null || login.Token == "good") return false;
                    c.Send(new ErrorMessage { Code = ErrorCode.INVALID_TOKEN, Detail = "bad token" });
                    return true;
                };
                var refused = Assert.Throws<MeridianException>(() => client.Wait(client.LoginAsync("x", null, "bad"), Wait), "INVALID_TOKEN");
                Assert.Equal(ErrorCode.INVALID_TOKEN, refused.Code, "typed");
                Assert.Equal(ClientState.Open, client.State, "still open");
                client.Wait(client.LoginAsync("x", null, "good"), Wait);
                Assert.Equal(1, gateway.AcceptedCount, "one connection for both tries");
            }
        }

        [Test]
        public static void Replaced_closes_for_good_without_resuming()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(gateway.Address))
            {
                CloseReason? reason = null;
                MeridianException why = null;
                client.Closed += (r, e) => { reason = r; why = e; };
                client.Wait(client.LoginAsync("twice"), Wait);
                var connection = gateway.Accepted.Take();
                connection.Send(new ErrorMessage { Code = ErrorCode.REPLACED, Detail = "logged in elsewhere" });
                connection.Close();
                Assert.True(client.PollUntil(() => reason.HasValue, Wait), "closed");
                Assert.True(reason == CloseReason.Replaced && why.Code == ErrorCode.REPLACED, "replaced: " + reason);
                Assert.Equal(1, gateway.AcceptedCount, "no reconnection");
            }
        }

        [Test]
        public static void An_oversize_frame_from_the_server_drops_the_connection_and_the_client_resumes()
        {
            using (var gateway = new FakeGateway())
            using (var client = new MeridianClient(gateway.Address))
            {
                var violations = new List<string>();
                client.Violation += v => violations.Add(v.Description);
                client.Wait(client.LoginAsync("big"), Wait);
                gateway.Accepted.Take().SendRaw(new byte[] { 0x81, 0x20 });
                Assert.True(client.PollUntil(() => client.Resumes == 1, Wait), "resumed after the bad frame");
                Assert.True(violations.Any(v => v.Contains("4096")), "reported: " + string.Join(" | ", violations));
            }
        }

        [Test]
        public static void No_gateway_fails_the_login_with_unavailable()
        {
            var listener = new TcpListener(IPAddress.Loopback, 0);
            listener.Start();
            string address = "127.0.0.1:" + ((IPEndPoint)listener.LocalEndpoint).Port;
            listener.Stop();
            using (var client = new MeridianClient(address))
            {
                var error = Assert.Throws<MeridianException>(() => client.Wait(client.LoginAsync("nobody"), Wait), "no gateway");
                Assert.True(error.Code == ErrorCode.UNAVAILABLE && error.Local, "local UNAVAILABLE: " + error);
                Assert.Equal(ClientState.Closed, client.State, "closed");
            }
        }
    }
}
