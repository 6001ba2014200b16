// The session's logic, on the polling thread: what each server message and socket event
// does to the state (login, answers, the view, errors), the resume and its failover to
// the next gateway, keep-alive, pacing, shutdown. The API and the pump are in MeridianClient.cs.
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Meridian.Client
{
    public sealed partial class MeridianClient
    {
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
