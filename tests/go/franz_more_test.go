package spatego

// More of franz-go: every compression codec, record timestamps and ListOffsets by
// time, DescribeProducers after idempotent producers, CreatePartitions, OffsetDelete,
// multi-group OffsetFetch, static group membership.

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	codecPartitions = 3
	codecRecords    = 300 // per codec
)

// TestFranzCodecsTimestampsProducers: one idempotent producer per codec (none, gzip,
// snappy, lz4, zstd), every record with its own timestamp; all of it read back by a
// partition consumer (no group) with timestamps; ListOffsets by timestamp; the
// producers' state as DescribeProducers shows it.
func TestFranzCodecsTimestampsProducers(t *testing.T) {
	e := loadEnv(t)
	ctx := testContext(t)
	cl := newFranz(t, e)
	defer cl.Close()
	adm := kadm.NewClient(cl)

	topic := uniqueName("franz-codecs")
	created, err := adm.CreateTopics(ctx, codecPartitions, e.replicationFactor, nil, topic)
	if err != nil || created[topic].Err != nil {
		t.Fatalf("CreateTopics %s: %v %+v", topic, err, created[topic])
	}
	waitTopicEverywhere(t, ctx, cl, topic, codecPartitions)

	codecs := []struct {
		name  string
		codec kgo.CompressionCodec
	}{
		{"none", kgo.NoCompression()}, {"gzip", kgo.GzipCompression()}, {"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()}, {"zstd", kgo.ZstdCompression()},
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	tsOf := func(seq int) time.Time { return base.Add(time.Duration(seq) * 10 * time.Millisecond) }
	var acks []produced
	// Each producer's id and what it wrote to each partition (for DescribeProducers).
	type producerWrites struct {
		id     int64
		epoch  int16
		counts map[int32]int32
	}
	var producers []producerWrites
	seq := 0
	for _, c := range codecs {
		p := newFranz(t, e, kgo.ProducerBatchCompression(c.codec))
		var recs []*kgo.Record
		for i := 0; i < codecRecords; i++ {
			s := seq + i
			// Compressible values, so the codecs have something to do.
			value := fmt.Sprintf("%s-%06d-%s", c.name, s, "abcdefgh abcdefgh abcdefgh abcdefgh")
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("key-%02d", s%franzKeys)),
				Value: []byte(value), Timestamp: tsOf(s),
				Headers: []kgo.RecordHeader{{Key: "seq", Value: []byte(strconv.Itoa(s))}}})
		}
		res := p.ProduceSync(ctx, recs...)
		if err := res.FirstErr(); err != nil {
			t.Fatalf("producing with %s: %v", c.name, err)
		}
		pw := producerWrites{counts: map[int32]int32{}}
		for _, r := range res {
			// The results come in the order the partitions answered, not the records'.
			s, _ := strconv.Atoi(string(r.Record.Headers[0].Value))
			acks = append(acks, produced{seq: s, key: string(r.Record.Key), value: string(r.Record.Value),
				partition: r.Record.Partition, offset: r.Record.Offset})
			pw.counts[r.Record.Partition]++
		}
		pw.id, pw.epoch, err = p.ProducerID(ctx)
		if err != nil || pw.id < 0 {
			t.Fatalf("the %s producer has no producer id: %d %v", c.name, pw.id, err)
		}
		producers = append(producers, pw)
		p.Close()
		seq += codecRecords
	}
	byPart, ends := checkAcks(t, acks, codecPartitions)

	// Read everything back from the start of each partition.
	offsets := map[string]map[int32]kgo.Offset{topic: {}}
	for p := int32(0); p < codecPartitions; p++ {
		offsets[topic][p] = kgo.NewOffset().AtStart()
	}
	consumer := newFranz(t, e, kgo.ConsumePartitions(offsets))
	defer consumer.Close()
	read := 0
	next := map[int32]int64{}
	waitFor(t, "the partition consumer reads every record", 60*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		fs := consumer.PollFetches(pctx)
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			if pctx.Err() == nil {
				ferr = fmt.Errorf("fetch error on partition %d: %w", p, err)
			}
		})
		if ferr != nil {
			t.Fatal(ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			want, ok := byPart[r.Partition][r.Offset]
			if !ok || r.Offset != next[r.Partition] {
				t.Fatalf("read %d/%d, expected offset %d next (acknowledged: %v)", r.Partition, r.Offset, next[r.Partition], ok)
			}
			next[r.Partition]++
			if string(r.Value) != want.value || string(r.Key) != want.key || !r.Timestamp.Equal(tsOf(want.seq)) ||
				len(r.Headers) != 1 || string(r.Headers[0].Value) != strconv.Itoa(want.seq) {
				t.Fatalf("read %d/%d as key %q value %q ts %v headers %v; wrote %q %q ts %v seq %d",
					r.Partition, r.Offset, r.Key, r.Value, r.Timestamp, r.Headers, want.key, want.value, tsOf(want.seq), want.seq)
			}
			read++
		})
		if read < len(acks) {
			return fmt.Errorf("read %d of %d", read, len(acks))
		}
		return nil
	})

	// ListOffsets by timestamp: the first offset of each partition at or after it.
	for _, s := range []int{0, 1, 777, len(acks) - 1} {
		milli := tsOf(s).UnixMilli()
		listed, err := adm.ListOffsetsAfterMilli(ctx, milli, topic)
		if err != nil || listed.Error() != nil {
			t.Fatalf("ListOffsetsAfterMilli: %v %v", err, listed.Error())
		}
		for p := int32(0); p < codecPartitions; p++ {
			want := ends[p]
			for o := int64(0); o < ends[p]; o++ {
				if byPart[p][o].seq >= s {
					want = o
					break
				}
			}
			got, _ := listed.Lookup(topic, p)
			if got.Offset != want {
				t.Fatalf("ListOffsetsAfterMilli(record %d's timestamp) on partition %d: %d, want %d", s, p, got.Offset, want)
			}
		}
	}

	// DescribeProducers: each producer with its last sequence on each partition.
	described, err := adm.DescribeProducers(ctx, kadm.TopicsSet{topic: {0: {}, 1: {}, 2: {}}})
	if err != nil {
		t.Fatalf("DescribeProducers: %v", err)
	}
	for p := int32(0); p < codecPartitions; p++ {
		dp := described[topic].Partitions[p]
		if dp.Err != nil {
			t.Fatalf("DescribeProducers %s/%d: %v %s", topic, p, dp.Err, dp.ErrMessage)
		}
		got := map[int64]string{}
		for _, ap := range dp.ActiveProducers {
			got[ap.ProducerID] = fmt.Sprintf("epoch %d last sequence %d", ap.ProducerEpoch, ap.LastSequence)
		}
		want := map[int64]string{}
		for _, pw := range producers {
			if n := pw.counts[p]; n > 0 {
				want[pw.id] = fmt.Sprintf("epoch %d last sequence %d", pw.epoch, n-1)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("DescribeProducers %s/%d: %v, want %v", topic, p, got, want)
		}
	}

	// CreatePartitions: two more, listed, and written to.
	cp, err := adm.CreatePartitions(ctx, 2, topic)
	if err != nil || cp[topic].Err != nil {
		t.Fatalf("CreatePartitions: %v %+v", err, cp[topic])
	}
	waitTopicEverywhere(t, ctx, cl, topic, codecPartitions+2)
	direct := newFranz(t, e, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer direct.Close()
	r, err := direct.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: codecPartitions + 1, Value: []byte("new")}).First()
	if err != nil || r.Partition != codecPartitions+1 || r.Offset != 0 {
		t.Fatalf("producing to a new partition: %v at %d/%d", err, r.Partition, r.Offset)
	}
}

// TestFranzGroupOffsetsAdmin: OffsetDelete, OffsetFetch for several groups at once, and
// a static member (group.instance.id) that leaves and comes back to its partitions.
func TestFranzGroupOffsetsAdmin(t *testing.T) {
	e := loadEnv(t)
	ctx := testContext(t)
	cl := newFranz(t, e)
	defer cl.Close()
	adm := kadm.NewClient(cl)

	topic := uniqueName("franz-offsets")
	created, err := adm.CreateTopics(ctx, 4, e.replicationFactor, nil, topic)
	if err != nil || created[topic].Err != nil {
		t.Fatalf("CreateTopics %s: %v %+v", topic, err, created[topic])
	}
	waitTopicEverywhere(t, ctx, cl, topic, 4)
	g1, g2 := uniqueName("franz-g1"), uniqueName("franz-g2")
	for i, g := range []string{g1, g2} {
		var os kadm.Offsets
		for p := int32(0); p < 4; p++ {
			os.Add(kadm.Offset{Topic: topic, Partition: p, At: int64(10*i) + int64(p), LeaderEpoch: -1})
		}
		if err := adm.CommitAllOffsets(ctx, g, os); err != nil {
			t.Fatalf("CommitAllOffsets %s: %v", g, err)
		}
	}
	many := adm.FetchManyOffsets(ctx, g1, g2)
	if err := many.Error(); err != nil {
		t.Fatalf("FetchManyOffsets: %v", err)
	}
	for i, g := range []string{g1, g2} {
		for p := int32(0); p < 4; p++ {
			o, ok := many[g].Fetched.Lookup(topic, p)
			if !ok || o.Err != nil || o.At != int64(10*i)+int64(p) {
				t.Fatalf("FetchManyOffsets %s %d: %+v, want %d", g, p, o, 10*i+int(p))
			}
		}
	}
	delResp, err := adm.DeleteOffsets(ctx, g1, kadm.TopicsSet{topic: {0: {}, 2: {}}})
	if err != nil || delResp.Error() != nil {
		t.Fatalf("DeleteOffsets: %v %v", err, delResp.Error())
	}
	fetched, err := adm.FetchOffsets(ctx, g1)
	if err != nil || fetched.Error() != nil {
		t.Fatalf("FetchOffsets: %v %v", err, fetched.Error())
	}
	var left []int32
	fetched.Each(func(r kadm.OffsetResponse) { left = append(left, r.Partition) })
	sort.Slice(left, func(i, j int) bool { return left[i] < left[j] })
	if fmt.Sprint(left) != "[1 3]" {
		t.Fatalf("after deleting partitions 0 and 2, %s has offsets for %v, want [1 3]", g1, left)
	}

	// A static member: its instance id is listed; it closes without leaving (kgo does not
	// send LeaveGroup for static members) and a new client with the same instance id
	// takes its place at once, with the same partitions and no new member.
	group := uniqueName("franz-static")
	assigned := make(chan []int32, 10)
	newStatic := func() *kgo.Client {
		return newFranz(t, e, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.InstanceID("static-1"),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				ps := append([]int32(nil), a[topic]...)
				sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
				assigned <- ps
			}))
	}
	s1 := newStatic()
	var first []int32
	select {
	case first = <-assigned:
	case <-time.After(60 * time.Second):
		t.Fatal("the static member got no assignment within 60s")
	}
	if len(first) != 4 {
		t.Fatalf("the only (static) member got %v", first)
	}
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("DescribeGroups: %v", err)
	}
	d := dg[group]
	if d.State != "Stable" || len(d.Members) != 1 || d.Members[0].InstanceID == nil || *d.Members[0].InstanceID != "static-1" {
		t.Fatalf("DescribeGroups %s: state %q members %+v, want one Stable member with instance id static-1", group, d.State, d.Members)
	}
	memberID := d.Members[0].MemberID
	s1.Close()
	dg, err = adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("DescribeGroups: %v", err)
	}
	if d := dg[group]; len(d.Members) != 1 || d.Members[0].MemberID != memberID {
		t.Fatalf("after a static member closed, the group has %+v; want it still there (no LeaveGroup for static members)", d.Members)
	}
	s2 := newStatic()
	defer s2.Close()
	select {
	case again := <-assigned:
		if fmt.Sprint(again) != fmt.Sprint(first) {
			t.Fatalf("the static member came back to %v, had %v", again, first)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the returning static member got no assignment within 60s")
	}
	dg, err = adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("DescribeGroups: %v", err)
	}
	if d := dg[group]; d.State != "Stable" || len(d.Members) != 1 || *d.Members[0].InstanceID != "static-1" {
		t.Fatalf("after the static member came back: state %q members %+v", d.State, d.Members)
	}
}
