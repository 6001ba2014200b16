// Varint length-delimited framing for byte streams (TCP): every protobuf body is preceded
// by its length as a protobuf varint, as writeDelimitedTo does. WebSocket does not use
// this: one binary WebSocket message is one body, unprefixed.
using System;

namespace Meridian.Client
{
    /// <summary>The stream cannot be framed any further; the connection must be closed.</summary>
    public sealed class FrameException : Exception
    {
        /// <summary>True when a frame was over the limit, false when the prefix was garbage.</summary>
        public readonly bool TooLarge;

        public FrameException(bool tooLarge, string message) : base(message)
        {
            TooLarge = tooLarge;
        }
    }

    /// <summary>The varint length prefix of byte-stream transports.</summary>
    public static class Framing
    {
        /// <summary>The protocol's default maximum body in both directions (the prefix not counted).</summary>
        public const int DefaultMaxFrameBytes = 4096;

        /// <summary>A u64 varint is at most 10 bytes; a longer run of continuation bits is garbage.</summary>
        const int MaxVarintBytes = 10;

        /// <summary><paramref name="body"/> with its varint length in front. Throws past <paramref name="maxFrameBytes"/>.</summary>
        public static byte[] EncodeFrame(byte[] body, int maxFrameBytes = DefaultMaxFrameBytes)
        {
            if (body.Length > maxFrameBytes)
            {
                throw new FrameException(true, "frame body of " + body.Length + " bytes exceeds " + maxFrameBytes);
            }
            var prefix = new byte[MaxVarintBytes];
            int n = 0;
            uint length = (uint)body.Length;
            while (length >= 0x80)
            {
                prefix[n++] = (byte)(length | 0x80);
                length >>= 7;
            }
            prefix[n++] = (byte)length;
            var frame = new byte[n + body.Length];
            Buffer.BlockCopy(prefix, 0, frame, 0, n);
            Buffer.BlockCopy(body, 0, frame, n, body.Length);
            return frame;
        }
    }

    /// <summary>
    /// Collects a byte stream and yields whole frame bodies. <see cref="Next"/> returns null
    /// while a frame is incomplete (that is not an error). A length over the limit is refused
    /// as soon as the prefix shows it, before its body is waited for or anything is allocated.
    /// Not thread-safe: one reader feeds it.
    /// </summary>
    public sealed class FrameDecoder
    {
        /// <summary>The largest body accepted; a longer announced length fails the stream.</summary>
        public readonly int MaxFrameBytes;
        byte[] buffer = new byte[256];
        int start, end;
        FrameException failed;

        public FrameDecoder(int maxFrameBytes = Framing.DefaultMaxFrameBytes)
        {
            MaxFrameBytes = maxFrameBytes;
        }

        /// <summary>Bytes received but not yet returned as a body.</summary>
        public int Buffered { get { return end - start; } }

        /// <summary>Appends bytes as they came off the stream.</summary>
        public void Push(byte[] chunk, int offset, int count)
        {
            if (failed != null) throw failed;
            if (buffer.Length - end < count)
            {
                int buffered = end - start;
                int needed = buffered + count;
                if (needed <= buffer.Length)
                {
                    Buffer.BlockCopy(buffer, start, buffer, 0, buffered);
                }
                else
                {
                    var grown = new byte[Math.Max(needed, buffer.Length * 2)];
                    Buffer.BlockCopy(buffer, start, grown, 0, buffered);
                    buffer = grown;
                }
                start = 0;
                end = buffered;
            }
            Buffer.BlockCopy(chunk, offset, buffer, end, count);
            end += count;
        }

        /// <summary>The next whole body, or null until more bytes arrive. Throws <see cref="FrameException"/> for good.</summary>
        public byte[] Next()
        {
            if (failed != null) throw failed;
            ulong length = 0;
            int position = start;
            for (int shift = 0; ; shift += 7)
            {
                if (position >= end) return null;
                if (position - start >= 10) throw Fail(false, "length prefix longer than 10 bytes");
                byte b = buffer[position++];
                if (shift < 64) length |= (ulong)(b & 0x7f) << shift;
                if (length > (ulong)MaxFrameBytes || (shift >= 63 && (b & 0x7f) > 1))
                {
                    throw Fail(true, "frame body of at least " + length + " bytes exceeds " + MaxFrameBytes);
                }
                if ((b & 0x80) == 0) break;
            }
            int n = (int)length;
            if (end - position < n) return null;
            var body = new byte[n];
            Buffer.BlockCopy(buffer, position, body, 0, n);
            start = position + n;
            if (start == end)
            {
                start = 0;
                end = 0;
            }
            return body;
        }

        FrameException Fail(bool tooLarge, string message)
        {
            failed = new FrameException(tooLarge, message);
            return failed;
        }
    }
}
