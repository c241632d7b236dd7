// Package bench holds what the Go peers of benches/compare share: the common flags
// and the one-line JSON report.
package bench

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// Opts are the flags every peer takes (the same as kafkapipe's compare_peer).
type Opts struct {
	Mode        string // produce | consume
	Brokers     string
	Topic       string
	Count       int
	Size        int
	Partitions  int
	Compression string // none | gzip | snappy | lz4 | zstd
	Acks        string // 0 | 1 | all
	Linger      time.Duration
	BatchBytes  int
	BatchMsgs   int
}

// Parse reads `MODE --flag value ...` from the command line.
func Parse() Opts {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: PEER produce|consume --brokers B --topic T --count N [--size S] "+
			"[--partitions P] [--compression C] [--acks 0|1|all] [--linger-ms 5] [--batch-bytes N] [--batch-msgs N]")
		os.Exit(2)
	}
	o := Opts{Mode: os.Args[1]}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	fs.StringVar(&o.Brokers, "brokers", "127.0.0.1:9092", "bootstrap brokers, comma-separated")
	fs.StringVar(&o.Topic, "topic", "", "topic")
	fs.IntVar(&o.Count, "count", 0, "messages to produce or consume")
	fs.IntVar(&o.Size, "size", 100, "value bytes (produce)")
	fs.IntVar(&o.Partitions, "partitions", 1, "partitions of the topic")
	fs.StringVar(&o.Compression, "compression", "none", "none|gzip|snappy|lz4|zstd")
	fs.StringVar(&o.Acks, "acks", "all", "0|1|all")
	lingerMs := fs.Int("linger-ms", 5, "how long a partition batch waits for more messages")
	fs.IntVar(&o.BatchBytes, "batch-bytes", 1<<20, "most bytes per partition batch")
	fs.IntVar(&o.BatchMsgs, "batch-msgs", 10000, "most messages per partition batch (where the client has such a cap)")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	o.Linger = time.Duration(*lingerMs) * time.Millisecond
	if o.Topic == "" || o.Count <= 0 {
		fmt.Fprintln(os.Stderr, "--topic and a positive --count are required")
		os.Exit(2)
	}
	return o
}

// Report prints the peer's own timing as one JSON line.
func Report(client string, msgs int, bytes int64, d time.Duration) {
	s := d.Seconds()
	fmt.Printf("{\"client\":%q,\"msgs\":%d,\"bytes\":%d,\"secs\":%.3f,\"msgs_per_sec\":%.0f,\"mb_per_sec\":%.2f}\n",
		client, msgs, bytes, s, float64(msgs)/s, float64(bytes)/s/1e6)
}

// Fail prints err and exits non-zero.
func Fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}
