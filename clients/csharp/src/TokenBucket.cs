using System;

namespace Meridian.Client
{
    /// <summary>A token bucket as the server keeps one: <c>rate</c> a second, up to <c>burst</c> at once.</summary>
    internal sealed class TokenBucket
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

        /// <summary>Takes a token if one is there at <paramref name="now"/> (seconds).</summary>
        public bool TryTake(double now)
        {
            tokens = Math.Min(burst, tokens + (now - last) * rate);
            last = now;
            if (tokens < 1) return false;
            tokens -= 1;
            return true;
        }
    }
}
