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
    /// <summary>How a client behaves; every field has the protocol's default.</summary>
    public sealed class ClientOptions
    {
        /// <summary>The cluster's gateways (<c>host:port</c> or <c>ws://host:port/</c>); the first is tried first.</summary>
        public List<string> Gateways = new List<string>();
        /// <summary>Send a Ping after this long without sending anything (the server closes after 120 s).</summary>
        public TimeSpan KeepAlive = TimeSpan.FromSeconds(30);
        /// <summary>How long after a drop the server keeps the player for Resume.</summary>
        public TimeSpan ResumeWindow = TimeSpan.FromSeconds(30);
        /// <summary>First wait between resume attempts, doubled after each failure up to <see cref="ReconnectMaxDelay"/>.</summary>
        public TimeSpan ReconnectDelay = TimeSpan.FromMilliseconds(250);
        /// <summary>The longest wait between resume attempts.</summary>
        public TimeSpan ReconnectMaxDelay = TimeSpan.FromSeconds(5);
        /// <summary>Give up opening one connection after this long.</summary>
        public TimeSpan OpenTimeout = TimeSpan.FromSeconds(10);
        /// <summary>Largest message body sent or accepted (both directions).</summary>
        public int MaxFrameBytes = Framing.DefaultMaxFrameBytes;
        /// <summary>
        /// Hold moves, chats and actions back so that the server's rate limits are never hit
        /// (they are sent later, in order, rather than refused). Off: everything is sent at
        /// once and the excess comes back as RATE_LIMITED.
        /// </summary>
        public bool PaceToLimits = true;
        /// <summary>Moves per second and burst; a little under the server's 20 so that jitter in transit does not push arrivals over.</summary>
        public double MovesPerSecond = 19, MoveBurst = 10;
        /// <summary>Chats per second and burst (the server's: 2, burst 5).</summary>
        public double ChatsPerSecond = 1.9, ChatBurst = 4;
        /// <summary>Actions per second and burst (the server's: 10, burst 20).</summary>
        public double ActionsPerSecond = 9.5, ActionBurst = 15;
        /// <summary>Moves and actions sent and not yet answered; the server refuses past 1,024.</summary>
        public int MaxInFlight = 1000;
        /// <summary>Seed for the jitter that spreads reconnections; 0 for a random one.</summary>
        public int Seed;
    }

    /// <summary>What LoginOk said, plus the resume token in force.</summary>
    public sealed class LoginInfo
    {
        /// <summary>The player and the world, as LoginOk said.</summary>
        public WorldInfo World;
        /// <summary>The player's id: the same after every resume.</summary>
        public ulong PlayerId { get { return World.PlayerId; } }
        /// <summary>Where the player started (the view's <c>Self</c> follows it since).</summary>
        public Position Position { get { return World.Position; } }
        /// <summary>Good for one Resume; each resume's ViewReset brings the next, kept here.</summary>
        public byte[] ResumeToken;
    }

    /// <summary>Where a client's session is.</summary>
    public enum ClientState
    {
        /// <summary>Not connected yet: LoginAsync connects.</summary>
        Idle,
        /// <summary>Opening a connection for the login.</summary>
        Connecting,
        /// <summary>Connected, not logged in.</summary>
        Open,
        /// <summary>Login sent, LoginOk awaited.</summary>
        LoggingIn,
        /// <summary>Logged in: moves, actions and chat may be sent.</summary>
        Playing,
        /// <summary>The connection dropped; reconnecting and resuming on its own.</summary>
        Resuming,
        /// <summary>For good.</summary>
        Closed,
    }

    /// <summary>Why a client closed for good.</summary>
    public enum CloseReason
    {
        /// <summary>LogoutAsync was called.</summary>
        Logout,
        /// <summary>CloseAsync or Dispose was called.</summary>
        Closed,
        /// <summary>Another login of the same account took over (REPLACED); not resumed.</summary>
        Replaced,
        /// <summary>The connection dropped (or never opened) before a login succeeded: nothing to resume.</summary>
        Dropped,
        /// <summary>No resume attempt succeeded within the resume window, or the token was refused.</summary>
        ResumeFailed,
    }

    /// <summary>A Meridian client session. See the file header for the threading rules.</summary>
    public sealed class MeridianClient : IDisposable, ITransportSink
    {
        enum Bucket { None, Move, Chat, Action }

        sealed class Outgoing
        {
            public byte[] Body;
            public Bucket Bucket;
            public bool Request;
        }

        sealed class TokenBucket
        {
            readonly double rate, burst;
            double tokens;
            double last;

            public TokenBucket(double rate, double burst, double now)
            {
                this.rate = rate;
                this.burst = burst;
                tokens = burst;
                last = now;
            }

            public bool TryTake(double now)
            {
                tokens = Math.Min(burst, tokens + (now - last) * rate);
                last = now;
                if (tokens < 1) return false;
                tokens -= 1;
                return true;
            }
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

        // ---------------- on the polling thread ----------------

        void Handle(Incoming item)
        {
            switch (item.Kind)
            {
                case 3: Opened(item.Source); return;
                case 4: OpenFailed(item.Text); return;
            }
            if (item.Source != transport)
            {
                // A connection this client replaced or closed: what it says no longer matters.
                if (item.Kind == 2) SettleCloseWaiters(item.Source);
                return;
            }
            if (item.Kind == 1)
            {
                Raise(Violation, new ProtocolViolation(item.Text));
                return;
            }
            if (item.Kind == 2)
            {
                Dropped(item.Text);
                return;
            }
            ServerMessage message;
            try
            {
                message = Codec.DecodeServer(item.Body);
            }
            catch (CodecException error)
            {
                Raise(Violation, new ProtocolViolation("an undecodable ServerMessage of " + item.Body.Length + " bytes: " + error.Message));
                return;
            }
            if (message == null)
            {
                Raise(Violation, new ProtocolViolation("a ServerMessage with no kind (or one this SDK does not know)"));
                return;
            }
            HandleMessage(message);
        }

        void Opened(Transport opened)
        {
            if (State == ClientState.Connecting)
            {
                transport = opened;
                openFailures = 0;
                State = ClientState.LoggingIn;
                Transmit(Encode(loginMessage));
            }
            else if (State == ClientState.Resuming && attemptInFlight)
            {
                transport = opened;
                // A gateway that took the connection but cannot resume (no shard for it) is left for the next.
                attemptDeadline = Now + options.OpenTimeout.TotalSeconds;
                Transmit(Encode(new Resume { Token = Info.ResumeToken }));
            }
            else
            {
                opened.Abort("not needed any more");
            }
        }

        void OpenFailed(string reason)
        {
            if (State == ClientState.Connecting)
            {
                // Try each gateway once before giving up on the login.
                openFailures++;
                gatewayIndex++;
                if (openFailures < gateways.Count)
                {
                    StartOpening();
                    return;
                }
                var error = new MeridianException(ErrorCode.UNAVAILABLE, "no gateway answered: " + reason, 0, true);
                FailLogin(error);
                Finish(CloseReason.Dropped, error);
            }
            else if (State == ClientState.Resuming && attemptInFlight)
            {
                AttemptFailed(new MeridianException(ErrorCode.UNAVAILABLE, reason, 0, true));
            }
        }

        void HandleMessage(ServerMessage message)
        {
            if (message is LoginOk ok)
            {
                if (State != ClientState.LoggingIn || login == null)
                {
                    Raise(Violation, new ProtocolViolation("LoginOk while " + State, message));
                    return;
                }
                var world = new WorldInfo
                {
                    PlayerId = ok.PlayerId, Name = loginMessage.Name, Position = ok.Position,
                    MapWidth = ok.MapWidth, MapHeight = ok.MapHeight, ViewRange = ok.ViewRange,
                };
                Info = new LoginInfo { World = world, ResumeToken = ok.ResumeToken };
                State = ClientState.Playing;
                View.Start(world);
                var pending = login;
                login = null;
                pending.TrySetResult(Info);
            }
            else if (message is ViewReset reset)
            {
                if (Info != null && reset.ResumeToken.Length > 0)
                {
                    // A resume (or a restore after a shard failure) spends the token held: the
                    // fresh one comes with the ViewReset, and only it works next time.
                    Info.ResumeToken = reset.ResumeToken;
                }
                if (State == ClientState.Resuming && attemptInFlight)
                {
                    attemptInFlight = false;
                    State = ClientState.Playing;
                    Resumes++;
                    View.Apply(message);
                    var handler = Resumed;
                    if (handler != null) handler(reset.Position, attempts, CurrentGateway);
                    return;
                }
                if (State != ClientState.Playing)
                {
                    Raise(Violation, new ProtocolViolation("ViewReset while " + State, message));
                    return;
                }
                // The shard was restored under us: nothing still pending was applied.
                ClearOutbox();
                answers.FailAll("not applied: the view was reset");
                View.Apply(message);
            }
            else if (message is Moved moved)
            {
                // The view first, so that a move's task completes with View.Self already moved.
                View.Apply(message);
                if (moved.ClientTime == 0) return;
                if (Info == null || moved.PlayerId != Info.PlayerId)
                {
                    Raise(Violation, new ProtocolViolation("a move ack for another entity (" + moved.PlayerId + ")", message));
                    return;
                }
                Report(answers.OnMoveAck(moved.ClientTime, moved.Position), message);
            }
            else if (message is ActionDone done)
            {
                Report(answers.OnActionDone(done.ClientTime, done.Payload), message);
            }
            else if (message is Pong pong)
            {
                double sentAt;
                if (!pings.TryGetValue(pong.ClientTime, out sentAt)) return;
                pings.Remove(pong.ClientTime);
                var handler = Pong;
                if (handler != null) handler(pong.ClientTime, TimeSpan.FromSeconds(Now - sentAt));
            }
            else if (message is ErrorMessage error)
            {
                HandleError(new MeridianException(error.Code, error.Detail, error.ClientTime), message);
            }
            else
            {
                View.Apply(message);
            }
        }

        void HandleError(MeridianException error, ServerMessage message)
        {
            if (error.Code == ErrorCode.REPLACED) fatal = error;
            // The gateway is stopping: the close follows, and the resume goes elsewhere.
            if (error.Code == ErrorCode.SHUTTING_DOWN) moveOn = true;
            if (error.ClientTime != 0)
            {
                if (pings.Remove(error.ClientTime))
                {
                    Raise(Error, error);
                    return;
                }
                bool matched;
                var violation = answers.OnError(error, out matched);
                if (violation != null) Raise(Violation, new ProtocolViolation(violation, message));
                if (!matched) Raise(Error, error);
                return;
            }
            if (State == ClientState.LoggingIn && login != null)
            {
                // The answer to the Login: the connection stays open for another try (unless it closes).
                State = ClientState.Open;
                FailLogin(error);
                return;
            }
            if (State == ClientState.Resuming && attemptInFlight)
            {
                if (error.Code == ErrorCode.REPLACED || error.Code == ErrorCode.INVALID_TOKEN)
                {
                    // Nothing to resume (the window passed, the token was spent) or the account plays elsewhere.
                    Finish(error.Code == ErrorCode.REPLACED ? CloseReason.Replaced : CloseReason.ResumeFailed, error);
                    return;
                }
                AttemptFailed(error);
                return;
            }
            Raise(Error, error);
        }

        void Report(string violation, ServerMessage message)
        {
            if (violation != null) Raise(Violation, new ProtocolViolation(violation, message));
        }

        /// <summary>The connection in use closed, from the other side or the network.</summary>
        void Dropped(string reason)
        {
            var dead = transport;
            transport = null;
            SettleCloseWaiters(dead);
            switch (State)
            {
                case ClientState.Closed:
                    return;
                case ClientState.Open:
                case ClientState.LoggingIn:
                case ClientState.Connecting:
                {
                    var error = new MeridianException(ErrorCode.UNAVAILABLE, "the connection closed before LoginOk: " + reason, 0, true);
                    FailLogin(error);
                    Finish(CloseReason.Dropped, error);
                    return;
                }
                case ClientState.Playing:
                    if (fatal != null)
                    {
                        Finish(CloseReason.Replaced, fatal);
                        return;
                    }
                    StartResume(reason);
                    return;
                case ClientState.Resuming:
                    if (attemptInFlight) AttemptFailed(new MeridianException(ErrorCode.UNAVAILABLE, reason, 0, true));
                    return;
            }
        }

        void StartResume(string reason)
        {
            State = ClientState.Resuming;
            pings.Clear();
            ClearOutbox();
            answers.FailAll("the connection dropped before the answer: it may or may not have been applied");
            resumeDeadline = Now + options.ResumeWindow.TotalSeconds;
            delay = options.ReconnectDelay.TotalSeconds;
            attempts = 0;
            lastResumeError = null;
            if (moveOn) gatewayIndex++;
            moveOn = false;
            nextAttemptAt = Now;
            var handler = Resuming;
            if (handler != null) handler(reason);
        }

        void AttemptFailed(MeridianException error)
        {
            attemptInFlight = false;
            lastResumeError = error;
            var dead = transport;
            transport = null;
            if (dead != null) dead.Abort("resume attempt failed");
            // The next attempt goes to the next gateway: this one may be the one going away.
            gatewayIndex++;
            moveOn = false;
            // Half fixed, half random: clients dropped together do not come back together.
            nextAttemptAt = Now + delay * (0.5 + 0.5 * random.NextDouble());
            delay = Math.Min(delay * 2, options.ReconnectMaxDelay.TotalSeconds);
        }

        double NextTimer()
        {
            double due = double.MaxValue;
            if (State == ClientState.Resuming)
            {
                due = attemptInFlight ? (transport != null ? Math.Min(attemptDeadline, resumeDeadline) : resumeDeadline) : Math.Min(nextAttemptAt, resumeDeadline);
            }
            else if (State == ClientState.Playing)
            {
                due = lastSentAt + options.KeepAlive.TotalSeconds;
                if (outbox.Count > 0) due = Math.Min(due, Now + 0.01);
            }
            return due;
        }

        void Timers()
        {
            double now = Now;
            if (State == ClientState.Resuming)
            {
                if (now >= resumeDeadline)
                {
                    Finish(CloseReason.ResumeFailed, lastResumeError
                        ?? new MeridianException(ErrorCode.UNAVAILABLE, "could not resume within the resume window", 0, true));
                    return;
                }
                if (attemptInFlight && transport != null && now >= attemptDeadline)
                {
                    AttemptFailed(new MeridianException(ErrorCode.UNAVAILABLE, "no ViewReset from " + CurrentGateway + " within " + options.OpenTimeout.TotalSeconds + " s", 0, true));
                }
                if (!attemptInFlight && now >= nextAttemptAt)
                {
                    attemptInFlight = true;
                    attempts++;
                    StartOpening();
                }
            }
            else if (State == ClientState.Playing && now - lastSentAt >= options.KeepAlive.TotalSeconds && outbox.Count == 0)
            {
                ulong clientTime = answers.NextClientTime();
                pings[clientTime] = now;
                Transmit(Encode(new Ping { ClientTime = clientTime }));
            }
        }

        void ClearOutbox()
        {
            outbox.Clear();
            heldRequests = 0;
        }

        void Enqueue(byte[] body, Bucket bucket, bool request)
        {
            outbox.Enqueue(new Outgoing { Body = body, Bucket = bucket, Request = request });
            if (request) heldRequests++;
            Flush();
        }

        /// <summary>Sends what the limits allow, in order: one held-back message holds back those after it.</summary>
        void Flush()
        {
            if (State != ClientState.Playing) return;
            while (outbox.Count > 0)
            {
                var next = outbox.Peek();
                if (options.PaceToLimits)
                {
                    if (next.Request && answers.Count - heldRequests >= options.MaxInFlight) return;
                    double now = Now;
                    var bucket = next.Bucket == Bucket.Move ? moveBucket : next.Bucket == Bucket.Chat ? chatBucket : next.Bucket == Bucket.Action ? actionBucket : null;
                    if (bucket != null && !bucket.TryTake(now)) return;
                }
                outbox.Dequeue();
                if (next.Request) heldRequests--;
                Transmit(next.Body);
            }
        }

        void Transmit(byte[] body)
        {
            var current = transport;
            if (current == null) return;
            current.Send(body);
            lastSentAt = Now;
        }

        byte[] Encode(ClientMessage message)
        {
            byte[] body;
            try
            {
                body = Codec.EncodeClient(message);
            }
            catch (EncoderFallbackException)
            {
                throw new MeridianException(ErrorCode.INVALID_ARGUMENT, "a string that is not valid UTF-16 (a lone surrogate)", 0, true);
            }
            if (body.Length > options.MaxFrameBytes)
            {
                throw new MeridianException(ErrorCode.FRAME_TOO_LARGE, "message of " + body.Length + " bytes exceeds " + options.MaxFrameBytes, 0, true);
            }
            return body;
        }

        MeridianException NotNow(string what)
        {
            var code = State == ClientState.Playing || State == ClientState.Resuming || State == ClientState.Closed
                ? ErrorCode.UNAVAILABLE : ErrorCode.NOT_LOGGED_IN;
            if (what == "log in" && State != ClientState.Closed) code = ErrorCode.ALREADY_LOGGED_IN;
            return new MeridianException(code, "cannot " + what + " while the client is " + State, 0, true);
        }

        void FailLogin(MeridianException error)
        {
            var pending = login;
            login = null;
            if (pending != null) pending.TrySetException(error);
        }

        Task ShutDown(CloseReason reason, string pendingDetail)
        {
            if (State == ClientState.Closed) return Task.FromResult(true);
            var current = transport;
            var waiter = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            if (current == null) waiter.TrySetResult(true);
            else closeWaiters.Add(waiter);
            FailLogin(new MeridianException(ErrorCode.UNAVAILABLE, pendingDetail, 0, true));
            answers.FailAll(pendingDetail);
            // Kept until its close arrives, so that SettleCloseWaiters knows it.
            closing = current;
            Finish(reason, null);
            if (current != null) current.CloseGracefully();
            return waiter.Task;
        }

        void SettleCloseWaiters(Transport closed)
        {
            if (closed == null || (closed != closing && closed != transport)) return;
            closing = null;
            var waiters = closeWaiters.ToArray();
            closeWaiters.Clear();
            foreach (var w in waiters) w.TrySetResult(true);
        }

        /// <summary>Enters Closed for good and says why.</summary>
        void Finish(CloseReason reason, MeridianException error)
        {
            State = ClientState.Closed;
            attemptInFlight = false;
            pings.Clear();
            ClearOutbox();
            answers.FailAll("the connection is closed");
            var current = transport;
            transport = null;
            if (current != null && current != closing) current.Abort("closed");
            var handler = Closed;
            if (handler != null) handler(reason, error);
        }

        static Task<T> Failed<T>(MeridianException error)
        {
            var source = new TaskCompletionSource<T>();
            source.SetException(error);
            return source.Task;
        }

        static void Raise<T>(Action<T> handler, T value)
        {
            if (handler != null) handler(value);
        }
    }
}
