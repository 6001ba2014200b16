// The byte pipes under a client: TCP (varint-framed) and WebSocket (one binary message per
// body). Each runs its own reader and writer threads and hands what it reads to a sink,
// which the client turns into work for its Poll() pump; nothing here touches client state.
using System;
using System.Collections.Concurrent;
using System.IO;
using System.Net.Sockets;
using System.Net.WebSockets;
using System.Threading;
using System.Threading.Tasks;

namespace Meridian.Client
{
    /// <summary>Where a gateway listens: <c>host:port</c> for TCP, <c>ws://host:port/</c> for WebSocket.</summary>
    public sealed class Gateway
    {
        /// <summary>The host name or address.</summary>
        public readonly string Host;
        /// <summary>The TCP port (the WebSocket's, for a WebSocket gateway).</summary>
        public readonly int Port;
        /// <summary>The WebSocket URL, or null for TCP.</summary>
        public readonly Uri WebSocketUri;

        /// <summary>A TCP gateway, or a WebSocket one when <paramref name="webSocketUri"/> is given.</summary>
        public Gateway(string host, int port, Uri webSocketUri = null)
        {
            Host = host;
            Port = port;
            WebSocketUri = webSocketUri;
        }

        /// <summary>Parses <c>host:port</c> (TCP) or <c>ws://host:port/path</c> / <c>wss://...</c> (WebSocket).</summary>
        public static Gateway Parse(string address)
        {
            if (address.StartsWith("ws://", StringComparison.OrdinalIgnoreCase)
                || address.StartsWith("wss://", StringComparison.OrdinalIgnoreCase))
            {
                var uri = new Uri(address);
                return new Gateway(uri.Host, uri.Port, uri);
            }
            int colon = address.LastIndexOf(':');
            int port;
            if (colon <= 0 || !int.TryParse(address.Substring(colon + 1), out port) || port <= 0 || port > 65535)
            {
                throw new FormatException("not host:port or ws://host:port/: " + address);
            }
            var host = address.Substring(0, colon).Trim('[', ']');
            return new Gateway(host, port);
        }

        public override string ToString()
        {
            return WebSocketUri != null ? WebSocketUri.ToString() : Host + ":" + Port;
        }
    }

    /// <summary>What a transport reports; called on the transport's own threads.</summary>
    internal interface ITransportSink
    {
        /// <summary>Connected; called before anything else of this transport is reported.</summary>
        void OnOpened(Transport source);
        void OnBody(Transport source, byte[] body);
        void OnViolation(Transport source, string description);
        /// <summary>Called exactly once, when the transport is done for good.</summary>
        void OnClosed(Transport source, string reason);
    }

    /// <summary>One connection to one gateway.</summary>
    internal abstract class Transport
    {
        protected readonly ITransportSink Sink;
        protected readonly int MaxFrameBytes;
        readonly BlockingCollection<byte[]> outgoing = new BlockingCollection<byte[]>();
        int closedReported;
        // Referenced so that it is not collected before it fires.
        internal Timer CloseTimer;
        public readonly Gateway Gateway;

        protected Transport(Gateway gateway, ITransportSink sink, int maxFrameBytes)
        {
            Gateway = gateway;
            Sink = sink;
            MaxFrameBytes = maxFrameBytes;
        }

        /// <summary>Opens a connection (blocking, on a worker thread); throws on failure.</summary>
        public static void Open(Gateway gateway, ITransportSink sink, int maxFrameBytes, TimeSpan timeout)
        {
            Transport transport;
            if (gateway.WebSocketUri != null) transport = new WebSocketTransport(gateway, sink, maxFrameBytes);
            else transport = new TcpTransport(gateway, sink, maxFrameBytes);
            transport.Connect(timeout);
            sink.OnOpened(transport);
            var reader = new Thread(transport.ReadLoop) { IsBackground = true, Name = "meridian-read " + gateway };
            var writer = new Thread(transport.WriteLoop) { IsBackground = true, Name = "meridian-write " + gateway };
            reader.Start();
            writer.Start();
        }

        /// <summary>Queues one message body; sent in order by the writer thread.</summary>
        public void Send(byte[] body)
        {
            try
            {
                outgoing.Add(body);
            }
            catch (InvalidOperationException)
            {
                // Closing: what is sent now is dropped, as on a socket that is going away.
            }
        }

        /// <summary>Sends what is queued, then closes the sending side; the peer's close ends it.</summary>
        public void CloseGracefully()
        {
            outgoing.CompleteAdding();
            // Whatever the peer does, the connection is gone within a few seconds.
            CloseTimer = new Timer(_ => Abort("closed"), null, 3000, Timeout.Infinite);
        }

        /// <summary>Drops the connection at once, as a network failure would.</summary>
        public void Abort(string reason)
        {
            outgoing.CompleteAdding();
            try
            {
                AbortConnection();
            }
            catch (Exception)
            {
                // Already gone.
            }
            ReportClosed(reason);
        }

        protected void ReportClosed(string reason)
        {
            if (Interlocked.Exchange(ref closedReported, 1) == 0) Sink.OnClosed(this, reason);
        }

        protected abstract void Connect(TimeSpan timeout);
        protected abstract void ReadLoop();
        protected abstract void Write(byte[] body);
        protected abstract void FinishSending();
        protected abstract void AbortConnection();

        void WriteLoop()
        {
            try
            {
                foreach (var body in outgoing.GetConsumingEnumerable()) Write(body);
                FinishSending();
            }
            catch (Exception error)
            {
                Abort("write failed: " + error.Message);
            }
        }
    }

    internal sealed class TcpTransport : Transport
    {
        readonly TcpClient client = new TcpClient();
        NetworkStream stream;

        public TcpTransport(Gateway gateway, ITransportSink sink, int maxFrameBytes) : base(gateway, sink, maxFrameBytes) { }

        protected override void Connect(TimeSpan timeout)
        {
            client.NoDelay = true;
            var connecting = client.ConnectAsync(Gateway.Host, Gateway.Port);
            bool done;
            try
            {
                done = connecting.Wait(timeout);
            }
            catch (AggregateException error)
            {
                client.Close();
                throw new IOException("cannot connect to " + Gateway + ": " + error.InnerException.Message);
            }
            if (!done)
            {
                client.Close();
                throw new IOException("no connection to " + Gateway + " within " + timeout.TotalMilliseconds + " ms");
            }
            stream = client.GetStream();
        }

        protected override void ReadLoop()
        {
            var decoder = new FrameDecoder(MaxFrameBytes);
            var chunk = new byte[8192];
            string reason = "the server closed the connection";
            try
            {
                while (true)
                {
                    int n = stream.Read(chunk, 0, chunk.Length);
                    if (n == 0) break;
                    decoder.Push(chunk, 0, n);
                    byte[] body;
                    while ((body = decoder.Next()) != null) Sink.OnBody(this, body);
                }
            }
            catch (FrameException error)
            {
                Sink.OnViolation(this, "the server's stream cannot be framed: " + error.Message);
                reason = error.Message;
            }
            catch (Exception error)
            {
                reason = "read failed: " + error.Message;
            }
            try
            {
                client.Close();
            }
            catch (Exception)
            {
            }
            ReportClosed(reason);
        }

        protected override void Write(byte[] body)
        {
            var frame = Framing.EncodeFrame(body, MaxFrameBytes);
            stream.Write(frame, 0, frame.Length);
        }

        protected override void FinishSending()
        {
            client.Client.Shutdown(SocketShutdown.Send);
        }

        protected override void AbortConnection()
        {
            // Linger 0: a reset, as when the network goes away, not a polite close.
            client.Client.LingerState = new LingerOption(true, 0);
            client.Close();
        }
    }

    internal sealed class WebSocketTransport : Transport
    {
        readonly ClientWebSocket socket = new ClientWebSocket();

        public WebSocketTransport(Gateway gateway, ITransportSink sink, int maxFrameBytes) : base(gateway, sink, maxFrameBytes) { }

        protected override void Connect(TimeSpan timeout)
        {
            socket.Options.AddSubProtocol("meridian.v1");
            using (var cancel = new CancellationTokenSource(timeout))
            {
                try
                {
                    socket.ConnectAsync(Gateway.WebSocketUri, cancel.Token).Wait();
                }
                catch (AggregateException error)
                {
                    socket.Dispose();
                    throw new IOException("cannot open a WebSocket to " + Gateway + ": " + error.InnerException.Message);
                }
            }
        }

        protected override void ReadLoop()
        {
            var buffer = new byte[MaxFrameBytes + 1];
            string reason = "the server closed the WebSocket";
            try
            {
                while (true)
                {
                    int filled = 0;
                    WebSocketReceiveResult result;
                    do
                    {
                        if (filled == buffer.Length)
                        {
                            Sink.OnViolation(this, "a WebSocket message over " + MaxFrameBytes + " bytes");
                            reason = "a message over the frame limit";
                            goto done;
                        }
                        result = socket.ReceiveAsync(new ArraySegment<byte>(buffer, filled, buffer.Length - filled), CancellationToken.None).Result;
                        filled += result.Count;
                    } while (!result.EndOfMessage && result.MessageType != WebSocketMessageType.Close);
                    if (result.MessageType == WebSocketMessageType.Close)
                    {
                        reason = "the server closed the WebSocket (" + result.CloseStatus + ")";
                        break;
                    }
                    if (filled > MaxFrameBytes)
                    {
                        Sink.OnViolation(this, "a WebSocket message over " + MaxFrameBytes + " bytes");
                        reason = "a message over the frame limit";
                        break;
                    }
                    if (result.MessageType == WebSocketMessageType.Text)
                    {
                        Sink.OnViolation(this, "a text WebSocket message");
                        continue;
                    }
                    var body = new byte[filled];
                    Buffer.BlockCopy(buffer, 0, body, 0, filled);
                    Sink.OnBody(this, body);
                }
            }
            catch (Exception error)
            {
                reason = "read failed: " + (error.InnerException ?? error).Message;
            }
            done:
            try
            {
                socket.Abort();
                socket.Dispose();
            }
            catch (Exception)
            {
            }
            ReportClosed(reason);
        }

        protected override void Write(byte[] body)
        {
            if (body.Length > MaxFrameBytes) throw new FrameException(true, "message of " + body.Length + " bytes over " + MaxFrameBytes);
            socket.SendAsync(new ArraySegment<byte>(body), WebSocketMessageType.Binary, true, CancellationToken.None).Wait();
        }

        protected override void FinishSending()
        {
            using (var cancel = new CancellationTokenSource(2000))
            {
                socket.CloseOutputAsync(WebSocketCloseStatus.NormalClosure, "", cancel.Token).Wait();
            }
        }

        protected override void AbortConnection()
        {
            socket.Abort();
        }
    }
}
