// The client's options, and the small types its API speaks in (LoginInfo, ClientState,
// CloseReason).
using System;
using System.Collections.Generic;

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
}
