// A tiny test runner, so that the tests need nothing but mono: every public static void
// method marked [Test] in this assembly runs, each bounded in time, and the counts are
// printed. `mono Meridian.Client.Tests.exe [unit|cluster|all] [name-filter]`.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Reflection;
using System.Threading;

namespace Meridian.Client.Tests
{
    [AttributeUsage(AttributeTargets.Method)]
    public sealed class TestAttribute : Attribute
    {
        /// <summary>Needs a real cluster (MERIDIAN_BIN).</summary>
        public bool Cluster;
        /// <summary>Runs after the other cluster tests (it stops a gateway).</summary>
        public bool Last;
    }

    public sealed class AssertionException : Exception
    {
        public AssertionException(string message) : base(message) { }
    }

    public static class Assert
    {
        public static void True(bool condition, string what)
        {
            if (!condition) throw new AssertionException(what);
        }

        public static void Equal<T>(T expected, T actual, string what)
        {
            if (!EqualityComparer<T>.Default.Equals(expected, actual))
            {
                throw new AssertionException(what + ": expected " + expected + ", got " + actual);
            }
        }

        public static TException Throws<TException>(Action action, string what) where TException : Exception
        {
            try
            {
                action();
            }
            catch (TException error)
            {
                return error;
            }
            catch (AggregateException error) when (error.InnerException is TException)
            {
                return (TException)error.InnerException;
            }
            catch (Exception error)
            {
                throw new AssertionException(what + ": expected " + typeof(TException).Name + ", got " + error.GetType().Name + ": " + error.Message);
            }
            throw new AssertionException(what + ": expected " + typeof(TException).Name + ", nothing was thrown");
        }
    }

    public static class Runner
    {
        /// <summary>The error and the first frames of its stack: enough to find it, short enough to read.</summary>
        static string Brief(Exception error)
        {
            var lines = (error.StackTrace ?? "").Split('\n').Where(l => !l.Contains("System.Reflection")).Take(4);
            return error.GetType().Name + ": " + error.Message + "\n" + string.Join("\n", lines);
        }

        static readonly TimeSpan PerTest = TimeSpan.FromSeconds(90);

        public static int Main(string[] args)
        {
            string mode = args.Length > 0 ? args[0] : "all";
            string filter = args.Length > 1 ? args[1] : null;
            var tests = typeof(Runner).Assembly.GetTypes()
                .SelectMany(t => t.GetMethods(BindingFlags.Public | BindingFlags.Static))
                .Select(m => new { Method = m, Attribute = m.GetCustomAttribute<TestAttribute>() })
                .Where(t => t.Attribute != null)
                .Where(t => mode == "all" || (mode == "cluster") == t.Attribute.Cluster)
                .Where(t => filter == null || t.Method.Name.Contains(filter))
                .OrderBy(t => t.Attribute.Cluster).ThenBy(t => t.Attribute.Last)
                .ThenBy(t => t.Method.DeclaringType.Name).ThenBy(t => t.Method.Name)
                .ToList();
            int passed = 0, failed = 0;
            var failures = new List<string>();
            try
            {
                if (tests.Any(t => t.Attribute.Cluster))
                {
                    // On this thread, which lives as long as the run (see TestCluster.Start); a
                    // failure to start is reported by every cluster test.
                    try { var started = TestCluster.Shared; } catch (Exception) { }
                }
                foreach (var test in tests)
                {
                    string name = test.Method.DeclaringType.Name + "." + test.Method.Name;
                    var watch = Stopwatch.StartNew();
                    Exception error = null;
                    var thread = new Thread(() =>
                    {
                        try
                        {
                            test.Method.Invoke(null, null);
                        }
                        catch (TargetInvocationException e)
                        {
                            error = e.InnerException;
                        }
                        catch (Exception e)
                        {
                            error = e;
                        }
                    }) { IsBackground = true };
                    thread.Start();
                    if (!thread.Join(PerTest)) error = new TimeoutException("the test did not end within " + PerTest.TotalSeconds + " s");
                    if (error == null)
                    {
                        passed++;
                        Console.WriteLine("ok    " + name + " (" + watch.ElapsedMilliseconds + " ms)");
                    }
                    else
                    {
                        failed++;
                        failures.Add(name);
                        Console.WriteLine("FAIL  " + name + " (" + watch.ElapsedMilliseconds + " ms): " + Brief(error));
                    }
                }
            }
            finally
            {
                TestCluster.StopShared();
            }
            Console.WriteLine();
            foreach (var name in failures) Console.WriteLine("failed: " + name);
            Console.WriteLine("C# client tests (" + mode + "): " + passed + " passed, " + failed + " failed, " + tests.Count + " total");
            return failed == 0 && tests.Count > 0 ? 0 : 1;
        }
    }
}
