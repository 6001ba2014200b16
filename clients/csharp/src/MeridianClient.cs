// A player's connection to a Meridian cluster: logs in, keeps itself alive, resumes on its
// own after a drop (on another gateway when its own shuts down), paces what it sends to the
// server's limits, and turns moves and actions into tasks settled by their answers. What the
// player sees is kept in View.
//
// Threading: the sockets run on their own threads, but everything the app sees (view
// changes, events, task completions) happens inside Poll(), on the thread that calls it:
// Unity's main thread from Update(), Godot's from _Process(). Call every other method on
// that thread too. Tasks complete with RunContinuationsAsynchronously, so an `await` on
// Unity's or Godot's main thread resumes there, after Poll() has returned.
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Meridian.Client
{
    /// <summary>A Meridian client session. See the file header for the threading rules.</summary>
    public sealed partial class MeridianClient : IDisposable, ITransportSink
    {
        enum Bucket { None, Move, Chat, Action }

        sealed class Outgoing
        {
            public byte[] Body;
            public Bucket Bucket;
            public bool Request;
        }

        sealed class Incoming
        {
            public Transport Source;
            public int Kind; // 0 body, 1 violation, 2 closed, 3 opened, 4 open failed
            public byte[] Body;
            public string Text;
        }

        readonly ClientOptions options;
        readonly List<Gateway> gateways = new List<Gateway>();
        readonly ConcurrentQueue<Incoming> inbox = new ConcurrentQueue<Incoming>();
        readonly SemaphoreSlim inboxSignal = new SemaphoreSlim(0);
        readonly Stopwatch clock = Stopwatch.StartNew();
        readonly AnswerBook answers = new AnswerBook();
        readonly Queue<Outgoing> outbox = new Queue<Outgoing>();
        // Moves and actions in the outbox: registered with the answer book, not yet sent.
        int heldRequests;
        readonly Dictionary<ulong, double> pings = new Dictionary<ulong, double>();
        readonly TokenBucket moveBucket, chatBucket, actionBucket;
        readonly Random random;
        readonly List<TaskCompletionSource<bool>> closeWaiters = new List<TaskCompletionSource<bool>>();

        Transport transport;
        // A transport closed by LogoutAsync/CloseAsync whose close is still awaited.
        Transport closing;
        int gatewayIndex;
        int openFailures;
        TaskCompletionSource<LoginInfo> login;
        Login loginMessage;
        double lastSentAt;
        MeridianException fatal;
        bool moveOn;
        // Resuming.
        double resumeDeadline, nextAttemptAt, attemptDeadline, delay;
        bool attemptInFlight;
        int attempts;
        MeridianException lastResumeError;

        /// <summary>What the player sees; fed by this client inside Poll().</summary>
        public readonly View View = new View();

        /// <summary>The connection dropped; resume attempts begin. Pending moves and actions were failed.</summary>
        public event Action<string> Resuming;
        /// <summary>Resume was accepted (ViewReset): position, attempts it took, the gateway now in use.</summary>
        public event Action<Position, int, Gateway> Resumed;
        /// <summary>For good: nothing more is sent or received. The error says why, when there is one.</summary>
        public event Action<CloseReason, MeridianException> Closed;
        /// <summary>A server error that answers no move or action (a chat refused, SHUTTING_DOWN...).</summary>
        public event Action<MeridianException> Error;
        /// <summary>The server broke the protocol; reported, never thrown. The view's violations come here too.</summary>
        public event Action<ProtocolViolation> Violation;
        /// <summary>The answer to a keep-alive Ping: client_time and round trip.</summary>
        public event Action<ulong, TimeSpan> Pong;

        /// <summary>A client of the cluster behind these gateways (<c>host:port</c> or <c>ws://host:port/</c>), with the default options. Nothing is opened until <see cref="LoginAsync"/>.</summary>
        public MeridianClient(params string[] gateways) : this(new ClientOptions { Gateways = new List<string>(gateways) }) { }

        /// <summary>A client with these options. Nothing is opened until <see cref="LoginAsync"/>.</summary>
        public MeridianClient(ClientOptions options)
        {
            this.options = options;
            foreach (var address in options.Gateways) gateways.Add(Gateway.Parse(address));
            if (gateways.Count == 0) throw new ArgumentException("ClientOptions.Gateways is empty");
            random = options.Seed == 0 ? new Random() : new Random(options.Seed);
            double now = Now;
            moveBucket = new TokenBucket(options.MovesPerSecond, options.MoveBurst, now);
            chatBucket = new TokenBucket(options.ChatsPerSecond, options.ChatBurst, now);
            actionBucket = new TokenBucket(options.ActionsPerSecond, options.ActionBurst, now);
            View.Violation += v => Raise(Violation, v);
        }

        /// <summary>Where the session is.</summary>
        public ClientState State { get; private set; }

        /// <summary>What LoginOk said, once logged in (its ResumeToken kept current).</summary>
        public LoginInfo Info { get; private set; }

        /// <summary>The gateway of the connection in use (or being opened).</summary>
        public Gateway CurrentGateway { get { return gateways[gatewayIndex % gateways.Count]; } }

        /// <summary>How many times the session was resumed.</summary>
        public int Resumes { get; private set; }

        /// <summary>Moves and actions sent (or held back) and not yet answered.</summary>
        public int Pending { get { return answers.Count; } }

        double Now { get { return clock.Elapsed.TotalSeconds; } }

        // ---------------- the API ----------------

        /// <summary>
        /// Connects (if not yet) and logs in as <paramref name="name"/> (1 to 32 bytes of UTF-8).
        /// Fails with the server's error (INVALID_TOKEN, INVALID_ARGUMENT...) as a <see cref="MeridianException"/>;
        /// the connection then stays open for another try.
        /// </summary>
        /// <param name="name">The display name (in dev mode without a token, also the account).</param>
        /// <param name="spawn">Where to appear; honoured by servers in dev mode only.</param>
        /// <param name="token">A JWT from the studio's login service, outside dev mode.</param>
        public Task<LoginInfo> LoginAsync(string name, Position? spawn = null, string token = "")
        {
            if (State != ClientState.Idle && State != ClientState.Open) return Failed<LoginInfo>(NotNow("log in"));
            var message = new Login { Name = name, Spawn = spawn, Token = token ?? "" };
            byte[] body;
            try
            {
                body = Encode(message);
            }
            catch (MeridianException error)
            {
                return Failed<LoginInfo>(error);
            }
            login = new TaskCompletionSource<LoginInfo>(TaskCreationOptions.RunContinuationsAsynchronously);
            loginMessage = message;
            if (State == ClientState.Idle)
            {
                State = ClientState.Connecting;
                StartOpening();
            }
            else
            {
                State = ClientState.LoggingIn;
                Transmit(body);
            }
            return login.Task;
        }

        /// <summary>Moves one cell; completes with the position the server acknowledged, or fails with its error (RATE_LIMITED...).</summary>
        public Task<Position> MoveAsync(Direction direction)
        {
            if (State != ClientState.Playing) return Failed<Position>(NotNow("move"));
            ulong clientTime = answers.NextClientTime();
            var body = Encode(new Move { Direction = direction, ClientTime = clientTime });
            var task = answers.ExpectMove(clientTime);
            Enqueue(body, Bucket.Move, true);
            return task;
        }

        /// <summary>A game-defined command; completes with ActionDone.payload, fails with REJECTED (the game said no) and others.</summary>
        public Task<byte[]> ActionAsync(uint kind, ulong target = 0, byte[] payload = null)
        {
            if (State != ClientState.Playing) return Failed<byte[]>(NotNow("act"));
            ulong clientTime = answers.NextClientTime();
            byte[] body;
            try
            {
                body = Encode(new ActionRequest { Kind = kind, Target = target, Payload = payload ?? new byte[0], ClientTime = clientTime });
            }
            catch (MeridianException error)
            {
                return Failed<byte[]>(error);
            }
            var task = answers.ExpectAction(clientTime);
            Enqueue(body, Bucket.Action, true);
            return task;
        }

        /// <summary>Says <paramref name="text"/> (1 to 256 bytes) to those in sight. A refusal comes as an Error event.</summary>
        public void Chat(string text)
        {
            if (State != ClientState.Playing) throw NotNow("chat");
            Enqueue(Encode(new Chat { Text = text }), Bucket.Chat, false);
        }

        /// <summary>Leaves the world for good (no resume) and closes; completes once the connection is closed.</summary>
        public Task LogoutAsync()
        {
            if (State == ClientState.Playing && transport != null)
            {
                // What is still held back would be answered UNAVAILABLE after the Logout anyway.
                ClearOutbox();
                transport.Send(Encode(new Logout()));
            }
            return ShutDown(CloseReason.Logout, "logged out before the answer");
        }

        /// <summary>Closes without logging out: the server keeps the player for the resume window.</summary>
        public Task CloseAsync()
        {
            return ShutDown(CloseReason.Closed, "the connection was closed before the answer");
        }

        /// <summary>Closes without logging out (as <see cref="CloseAsync"/>).</summary>
        public void Dispose()
        {
            CloseAsync();
        }

        /// <summary>Drops the connection abruptly, as a network failure would (for tests and drills); the client resumes.</summary>
        public void Sever()
        {
            var current = transport;
            if (current != null) current.Abort("severed");
        }

        /// <summary>
        /// Does everything that is due: applies what arrived (view changes, events, answers),
        /// sends what was held back, keeps the connection alive, resumes. Call it every frame.
        /// Waits up to <paramref name="timeoutMs"/> for something to arrive when nothing has
        /// (0: never blocks). Returns the number of messages and socket events handled.
        /// </summary>
        public int Poll(int timeoutMs = 0)
        {
            int handled = 0;
            Incoming item;
            if (inbox.IsEmpty && timeoutMs > 0)
            {
                int wait = timeoutMs;
                double due = NextTimer();
                if (due < double.MaxValue) wait = (int)Math.Max(0, Math.Min(wait, (due - Now) * 1000 + 1));
                inboxSignal.Wait(wait);
            }
            while (inbox.TryDequeue(out item))
            {
                inboxSignal.Wait(0);
                Handle(item);
                handled++;
            }
            Timers();
            Flush();
            return handled;
        }

        /// <summary>Polls until <paramref name="condition"/> holds (true) or the timeout passes (false). For consoles and tests.</summary>
        public bool PollUntil(Func<bool> condition, TimeSpan timeout)
        {
            var deadline = Now + timeout.TotalSeconds;
            while (!condition())
            {
                double left = deadline - Now;
                if (left <= 0) return false;
                Poll((int)Math.Min(50, left * 1000 + 1));
            }
            return true;
        }

        /// <summary>Polls until <paramref name="task"/> completes, then returns its result or throws its error (unwrapped). For consoles and tests.</summary>
        public T Wait<T>(Task<T> task, TimeSpan timeout)
        {
            Wait((Task)task, timeout);
            return task.Result;
        }

        /// <summary>Polls until <paramref name="task"/> completes; throws its error (unwrapped), or TimeoutException.</summary>
        public void Wait(Task task, TimeSpan timeout)
        {
            if (!PollUntil(() => task.IsCompleted, timeout))
            {
                throw new TimeoutException("no answer within " + timeout.TotalMilliseconds + " ms");
            }
            if (task.IsFaulted) throw task.Exception.InnerException;
            if (task.IsCanceled) throw new TaskCanceledException(task);
        }

        // ---------------- transport events, from the transports' threads ----------------

        void ITransportSink.OnOpened(Transport source) { Post(new Incoming { Source = source, Kind = 3 }); }
        void ITransportSink.OnBody(Transport source, byte[] body) { Post(new Incoming { Source = source, Kind = 0, Body = body }); }
        void ITransportSink.OnViolation(Transport source, string description) { Post(new Incoming { Source = source, Kind = 1, Text = description }); }
        void ITransportSink.OnClosed(Transport source, string reason) { Post(new Incoming { Source = source, Kind = 2, Text = reason }); }

        void Post(Incoming item)
        {
            inbox.Enqueue(item);
            inboxSignal.Release();
        }

        void StartOpening()
        {
            var gateway = CurrentGateway;
            var timeout = options.OpenTimeout;
            if (State == ClientState.Resuming)
            {
                double left = resumeDeadline - Now;
                if (left < timeout.TotalSeconds) timeout = TimeSpan.FromSeconds(Math.Max(0.05, left));
            }
            var sink = (ITransportSink)this;
            int maxFrame = options.MaxFrameBytes;
            Task.Run(() =>
            {
                try
                {
                    Transport.Open(gateway, sink, maxFrame, timeout);
                }
                catch (Exception error)
                {
                    Post(new Incoming { Kind = 4, Text = error.Message });
                }
            });
        }
    }
}
