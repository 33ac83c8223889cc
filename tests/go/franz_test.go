package spatego

// franz-go (github.com/twmb/franz-go): kgo's producer with its defaults (idempotent,
// acks=all, snappy batches), a kgo consumer group of two members of which one leaves,
// and kadm's admin calls, each answer compared with what was written.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	franzPartitions = 6
	franzRecords    = 3000
	franzKeys       = 50
)

func franzOpts(e env, extra ...kgo.Opt) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(e.bootstrap...)}
	switch e.logLevel {
	case "debug":
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelDebug, nil)))
	case "info":
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, nil)))
	}
	return append(opts, extra...)
}

func newFranz(t *testing.T, e env, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(franzOpts(e, extra...)...)
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	return cl
}

func strp(s string) *string { return &s }

// TestFranzAdmin: kadm's topic, config, cluster, offset and group calls.
func TestFranzAdmin(t *testing.T) {
	e := loadEnv(t)
	ctx := testContext(t)
	cl := newFranz(t, e)
	defer cl.Close()
	adm := kadm.NewClient(cl)

	// Describe cluster: every broker, each with its own id and address.
	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		t.Fatalf("BrokerMetadata: %v", err)
	}
	if len(md.Brokers) != e.brokers {
		t.Fatalf("BrokerMetadata lists %d brokers, want %d: %+v", len(md.Brokers), e.brokers, md.Brokers)
	}
	ids := map[int32]bool{}
	for _, b := range md.Brokers {
		if ids[b.NodeID] || b.Host == "" || b.Port <= 0 {
			t.Fatalf("bad broker list %+v", md.Brokers)
		}
		ids[b.NodeID] = true
	}
	if !ids[md.Controller] {
		t.Fatalf("controller %d is not among the brokers %+v", md.Controller, md.Brokers)
	}

	// Create two topics, one with a config; a second create of the same name fails.
	topic, other := uniqueName("franz-admin"), uniqueName("franz-admin-other")
	created, err := adm.CreateTopics(ctx, 3, e.replicationFactor, map[string]*string{"retention.ms": strp("3600000")}, topic, other)
	if err != nil {
		t.Fatalf("CreateTopics: %v", err)
	}
	for _, name := range []string{topic, other} {
		r, ok := created[name]
		if !ok || r.Err != nil {
			t.Fatalf("CreateTopics %s: %+v", name, r)
		}
		if r.NumPartitions != 3 || r.ReplicationFactor != e.replicationFactor {
			t.Fatalf("CreateTopics %s answered %d partitions x %d replicas, want 3 x %d", name, r.NumPartitions, r.ReplicationFactor, e.replicationFactor)
		}
	}
	waitTopicEverywhere(t, ctx, cl, topic, 3)
	waitTopicEverywhere(t, ctx, cl, other, 3)
	again, err := adm.CreateTopics(ctx, 3, e.replicationFactor, nil, topic)
	if err != nil {
		t.Fatalf("CreateTopics again: %v", err)
	}
	if r := again[topic]; !errors.Is(r.Err, kerr.TopicAlreadyExists) {
		t.Fatalf("creating %s twice: %v, want TOPIC_ALREADY_EXISTS", topic, r.Err)
	}

	// List / describe topics: partitions, leaders, replicas and ISR.
	waitFor(t, "ListTopics shows both topics with full ISRs", 30*time.Second, func() error {
		td, err := adm.ListTopics(ctx, topic, other)
		if err != nil {
			return err
		}
		for _, name := range []string{topic, other} {
			d, ok := td[name]
			if !ok || d.Err != nil {
				return fmt.Errorf("topic %s: %+v", name, d)
			}
			if len(d.Partitions) != 3 {
				return fmt.Errorf("topic %s has %d partitions, want 3", name, len(d.Partitions))
			}
			for _, p := range d.Partitions.Sorted() {
				if p.Err != nil || !ids[p.Leader] || len(p.Replicas) != int(e.replicationFactor) || len(p.ISR) != int(e.replicationFactor) {
					return fmt.Errorf("topic %s partition %d: leader %d replicas %v isr %v err %v", name, p.Partition, p.Leader, p.Replicas, p.ISR, p.Err)
				}
			}
		}
		return nil
	})
	waitFor(t, "ListTopics without names lists both", 30*time.Second, func() error {
		all, err := adm.ListTopics(ctx)
		if err != nil {
			return err
		}
		if !all.Has(topic) || !all.Has(other) {
			return fmt.Errorf("ListTopics without names lacks %s or %s: %v", topic, other, all.Names())
		}
		return nil
	})

	// Describe / alter configs. An alter answered by one broker is seen by the others
	// once their metadata catches up (in Kafka too), so the reads wait for the values.
	waitConfig := func(name, key, value string, source kmsg.ConfigSource) {
		t.Helper()
		start := time.Now()
		waitFor(t, fmt.Sprintf("%s of %s = %s (%v)", key, name, value, source), 15*time.Second, func() error {
			rcs, err := adm.DescribeTopicConfigs(ctx, name)
			if err != nil {
				return err
			}
			rc, err := rcs.On(name, nil)
			if err != nil || rc.Err != nil {
				return fmt.Errorf("DescribeTopicConfigs %s: %v %v", name, err, rc.Err)
			}
			for _, c := range rc.Configs {
				if c.Key == key {
					if c.MaybeValue() != value || c.Source != source {
						return fmt.Errorf("%s = %q (source %v)", key, c.MaybeValue(), c.Source)
					}
					return nil
				}
			}
			return fmt.Errorf("DescribeTopicConfigs %s has no %s", name, key)
		})
		t.Logf("%s of %s = %s: seen after %v", key, name, value, time.Since(start).Round(time.Millisecond))
	}
	waitConfig(topic, "retention.ms", "3600000", kmsg.ConfigSourceDynamicTopicConfig)
	waitConfig(other, "retention.bytes", "-1", kmsg.ConfigSourceDefaultConfig)
	alt, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{
		{Op: kadm.SetConfig, Name: "retention.bytes", Value: strp("1048576")},
		{Op: kadm.DeleteConfig, Name: "retention.ms"},
	}, topic)
	if err != nil {
		t.Fatalf("AlterTopicConfigs: %v", err)
	}
	if r, err := alt.On(topic, nil); err != nil || r.Err != nil {
		t.Fatalf("AlterTopicConfigs %s: %v %v %s", topic, err, r.Err, r.ErrMessage)
	}
	waitConfig(topic, "retention.bytes", "1048576", kmsg.ConfigSourceDynamicTopicConfig)
	waitConfig(topic, "retention.ms", "604800000", kmsg.ConfigSourceDefaultConfig)
	bad, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "no.such.config", Value: strp("1")}}, topic)
	if err != nil {
		t.Fatalf("AlterTopicConfigs (unknown config): %v", err)
	}
	if r, _ := bad.On(topic, nil); !errors.Is(r.Err, kerr.InvalidConfig) {
		t.Fatalf("setting an unknown config: %v, want INVALID_CONFIG", r.Err)
	}
	brokerCfgs, err := adm.DescribeBrokerConfigs(ctx, md.Brokers[0].NodeID)
	if err != nil {
		t.Fatalf("DescribeBrokerConfigs: %v", err)
	}
	if len(brokerCfgs) != 1 || brokerCfgs[0].Err != nil || len(brokerCfgs[0].Configs) == 0 {
		t.Fatalf("DescribeBrokerConfigs %d: %+v", md.Brokers[0].NodeID, brokerCfgs)
	}

	// Offsets: start and end of an empty topic, then commit and fetch for a group that
	// has no members.
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil || ends.Error() != nil {
		t.Fatalf("ListEndOffsets: %v %v", err, ends.Error())
	}
	for p := int32(0); p < 3; p++ {
		if o, ok := ends.Lookup(topic, p); !ok || o.Offset != 0 {
			t.Fatalf("end offset of empty %s/%d: %+v", topic, p, o)
		}
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("a")}).FirstErr(); err != nil {
		t.Fatalf("ProduceSync: %v", err)
	}
	group := uniqueName("franz-admin-group")
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1, LeaderEpoch: -1, Metadata: "zero"})
	offs.Add(kadm.Offset{Topic: topic, Partition: 2, At: 0, LeaderEpoch: -1, Metadata: "two"})
	if err := adm.CommitAllOffsets(ctx, group, offs); err != nil {
		t.Fatalf("CommitAllOffsets: %v", err)
	}
	fetched, err := adm.FetchOffsets(ctx, group)
	if err != nil || fetched.Error() != nil {
		t.Fatalf("FetchOffsets: %v %v", err, fetched.Error())
	}
	got := map[int32][2]string{}
	fetched.Each(func(r kadm.OffsetResponse) {
		got[r.Partition] = [2]string{strconv.FormatInt(r.At, 10), r.Metadata}
	})
	if want := map[int32][2]string{0: {"1", "zero"}, 2: {"0", "two"}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("FetchOffsets %s = %v, want %v", group, got, want)
	}
	listed, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatalf("ListGroups: %v", err)
	}
	if _, ok := listed[group]; !ok {
		t.Fatalf("ListGroups lacks %s: %v", group, listed.Groups())
	}
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("DescribeGroups: %v", err)
	}
	if d := dg[group]; d.Err != nil || d.State != "Empty" || len(d.Members) != 0 {
		t.Fatalf("DescribeGroups %s: state %q members %d err %v, want Empty with none", group, d.State, len(d.Members), d.Err)
	}
	del, err := adm.DeleteGroups(ctx, group)
	if err != nil || del[group].Err != nil {
		t.Fatalf("DeleteGroups %s: %v %+v", group, err, del[group])
	}
	fetched, err = adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("FetchOffsets after delete: %v", err)
	}
	if n := len(fetched.Offsets()); n != 0 {
		t.Fatalf("a deleted group still has %d committed offsets: %v", n, fetched)
	}

	// Delete a topic: gone from the listing.
	dt, err := adm.DeleteTopics(ctx, other)
	if err != nil || dt[other].Err != nil {
		t.Fatalf("DeleteTopics %s: %v %+v", other, err, dt[other])
	}
	waitFor(t, "the deleted topic leaves the listing", 30*time.Second, func() error {
		td, err := adm.ListTopics(ctx)
		if err != nil {
			return err
		}
		if td.Has(other) {
			return fmt.Errorf("%s still listed", other)
		}
		if !td.Has(topic) {
			return fmt.Errorf("%s (not deleted) is gone", topic)
		}
		return nil
	})
}

// franzMember is one kgo group consumer and what it read.
type franzMember struct {
	name string
	cl   *kgo.Client

	mu       sync.Mutex
	assigned map[int32]bool
	lastOff  map[int32]int64 // last offset read per partition: reads must go up
	read     int
}

func (m *franzMember) partitions() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ps []int32
	for p := range m.assigned {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}

func newFranzMember(t *testing.T, e env, name, group, topic string) *franzMember {
	m := &franzMember{name: name, assigned: map[int32]bool{}, lastOff: map[int32]int64{}}
	m.cl = newFranz(t, e,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(),
		kgo.ClientID(name),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, p := range a[topic] {
				m.assigned[p] = true
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, p := range r[topic] {
				delete(m.assigned, p)
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, l map[string][]int32) {
			t.Errorf("%s lost partitions %v (session expired or fenced)", name, l)
		}),
	)
	return m
}

// TestFranzProduceConsumeGroup: kgo's default producer writes franzRecords keyed records
// with headers; a group of two kgo consumers splits the partitions, one commits and
// leaves, the other takes its partitions over from the committed offsets and reads the
// rest. Every record is read exactly once with its key, value and headers, in offset
// order per partition, and the committed offsets end at the log end offsets.
func TestFranzProduceConsumeGroup(t *testing.T) {
	e := loadEnv(t)
	ctx := testContext(t)
	cl := newFranz(t, e)
	defer cl.Close()
	adm := kadm.NewClient(cl)

	topic := uniqueName("franz")
	created, err := adm.CreateTopics(ctx, franzPartitions, e.replicationFactor, nil, topic)
	if err != nil || created[topic].Err != nil {
		t.Fatalf("CreateTopics %s: %v %+v", topic, err, created[topic])
	}
	waitTopicEverywhere(t, ctx, cl, topic, franzPartitions)

	// Produce with kgo's defaults: idempotent, acks=all, up to 5 requests in flight per
	// broker, the sticky-key partitioner (murmur2 of the key, as Kafka's).
	acks := make([]produced, franzRecords)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var produceErrs []error
	for i := 0; i < franzRecords; i++ {
		key := fmt.Sprintf("key-%02d", i%franzKeys)
		value := fmt.Sprintf("franz-%06d", i)
		r := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value),
			Headers: []kgo.RecordHeader{{Key: "seq", Value: []byte(strconv.Itoa(i))}}}
		wg.Add(1)
		i := i
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				errMu.Lock()
				produceErrs = append(produceErrs, fmt.Errorf("record %d: %w", i, err))
				errMu.Unlock()
				return
			}
			acks[i] = produced{seq: i, key: key, value: value, partition: r.Partition, offset: r.Offset}
		})
	}
	wg.Wait()
	if len(produceErrs) > 0 {
		t.Fatalf("%d produce errors, first: %v", len(produceErrs), produceErrs[0])
	}
	if pid, epoch, err := cl.ProducerID(ctx); err != nil || pid < 0 || epoch < 0 {
		t.Fatalf("kgo's default producer is not idempotent here: producer id %d epoch %d err %v", pid, epoch, err)
	}
	byPart, ends := checkAcks(t, acks, franzPartitions)
	for p, n := range ends {
		if n == 0 {
			t.Fatalf("partition %d got no records (keys spread over every partition)", p)
		}
	}
	listedEnds, err := adm.ListEndOffsets(ctx, topic)
	if err != nil || listedEnds.Error() != nil {
		t.Fatalf("ListEndOffsets: %v %v", err, listedEnds.Error())
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil || starts.Error() != nil {
		t.Fatalf("ListStartOffsets: %v %v", err, starts.Error())
	}
	for p := int32(0); p < franzPartitions; p++ {
		end, _ := listedEnds.Lookup(topic, p)
		start, _ := starts.Lookup(topic, p)
		if end.Offset != ends[p] || start.Offset != 0 {
			t.Fatalf("partition %d: ListOffsets says [%d, %d), the producer's acks [0, %d)", p, start.Offset, end.Offset, ends[p])
		}
	}

	// Two members. a joins alone and gets every partition; b joins and the
	// cooperative-sticky balancer (kgo's default) moves half of them to b. Neither polls
	// before the split, so nothing is read twice.
	group := uniqueName("franz-group")
	a := newFranzMember(t, e, "member-a", group, topic)
	defer a.cl.Close()
	waitFor(t, "member a owns every partition", 60*time.Second, func() error {
		if n := len(a.partitions()); n != franzPartitions {
			return fmt.Errorf("a owns %v", a.partitions())
		}
		return nil
	})
	b := newFranzMember(t, e, "member-b", group, topic)
	bClosed := false
	defer func() {
		if !bClosed {
			b.cl.Close()
		}
	}()
	waitFor(t, "a and b split the partitions", 60*time.Second, func() error {
		pa, pb := a.partitions(), b.partitions()
		if len(pa) == 0 || len(pb) == 0 || len(pa)+len(pb) != franzPartitions {
			return fmt.Errorf("a owns %v, b owns %v", pa, pb)
		}
		return nil
	})
	dg, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("DescribeGroups: %v", err)
	}
	d := dg[group]
	if d.Err != nil || d.State != "Stable" || d.ProtocolType != "consumer" || d.Protocol != "cooperative-sticky" || len(d.Members) != 2 {
		t.Fatalf("DescribeGroups %s: state %q protocol %q/%q, %d members, err %v; want Stable consumer/cooperative-sticky with 2",
			group, d.State, d.ProtocolType, d.Protocol, len(d.Members), d.Err)
	}
	if as := d.AssignedPartitions(); len(as[topic]) != franzPartitions {
		t.Fatalf("DescribeGroups: the members are assigned %v, want all %d partitions", as, franzPartitions)
	}

	seen := map[int32]map[int64]bool{}
	total := 0
	poll := func(m *franzMember) {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		// At most 100 records a poll, so that b leaves with records still to read.
		fs := m.cl.PollRecords(pctx, 100)
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: fetch error on %s/%d: %v", m.name, topic, p, err)
			}
		})
		m.mu.Lock()
		defer m.mu.Unlock()
		fs.EachRecord(func(r *kgo.Record) {
			want, ok := byPart[r.Partition][r.Offset]
			if !ok {
				t.Fatalf("%s read partition %d offset %d, which was never acknowledged", m.name, r.Partition, r.Offset)
			}
			if string(r.Key) != want.key || string(r.Value) != want.value || len(r.Headers) != 1 ||
				r.Headers[0].Key != "seq" || string(r.Headers[0].Value) != strconv.Itoa(want.seq) {
				t.Fatalf("%s read %d/%d as key %q value %q headers %v; %q %q seq %d was written",
					m.name, r.Partition, r.Offset, r.Key, r.Value, r.Headers, want.key, want.value, want.seq)
			}
			if last, ok := m.lastOff[r.Partition]; ok && r.Offset != last+1 {
				t.Fatalf("%s read %d/%d after %d/%d: skipped or went back", m.name, r.Partition, r.Offset, r.Partition, last)
			}
			m.lastOff[r.Partition] = r.Offset
			if seen[r.Partition] == nil {
				seen[r.Partition] = map[int64]bool{}
			}
			if seen[r.Partition][r.Offset] {
				t.Fatalf("%s read %d/%d, which the group had already read", m.name, r.Partition, r.Offset)
			}
			seen[r.Partition][r.Offset] = true
			m.read++
			total++
		})
	}

	// Both read until b has read a few hundred records (or all of its partitions).
	bParts := b.partitions()
	var bTotal int64
	for _, p := range bParts {
		bTotal += ends[p]
	}
	bTarget := int(min(bTotal/2, 300))
	waitFor(t, "b reads its first records", 60*time.Second, func() error {
		poll(a)
		poll(b)
		if b.read < bTarget {
			return fmt.Errorf("b read %d of %d (a %d)", b.read, bTarget, a.read)
		}
		return nil
	})

	// b commits what it read and leaves the group.
	if err := b.cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("b's commit: %v", err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil || committed.Error() != nil {
		t.Fatalf("FetchOffsets: %v %v", err, committed.Error())
	}
	// (b's callbacks take b.mu: copy what b read, so no Fatalf below holds it.)
	b.mu.Lock()
	bLast := make(map[int32]int64, len(b.lastOff))
	for p, o := range b.lastOff {
		bLast[p] = o
	}
	b.mu.Unlock()
	for _, p := range bParts {
		want := int64(-1)
		if last, ok := bLast[p]; ok {
			want = last + 1
		}
		got, ok := committed.Lookup(topic, p)
		if want >= 0 && (!ok || got.At != want) {
			t.Fatalf("b's commit of partition %d: the broker has %+v, b read up to %d", p, got, want)
		}
	}
	b.cl.Close()
	bClosed = true
	bRead := b.read

	// a takes b's partitions over from b's commits and reads the rest.
	waitFor(t, "a reads every record", 90*time.Second, func() error {
		poll(a)
		if total < franzRecords || len(a.partitions()) != franzPartitions {
			return fmt.Errorf("the group read %d of %d (a %d, b %d); a owns %v", total, franzRecords, a.read, bRead, a.partitions())
		}
		return nil
	})
	if n := len(a.partitions()); n != franzPartitions {
		t.Fatalf("after b left, a owns %v, want every partition", a.partitions())
	}
	if err := a.cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("a's commit: %v", err)
	}
	committed, err = adm.FetchOffsets(ctx, group)
	if err != nil || committed.Error() != nil {
		t.Fatalf("FetchOffsets: %v %v", err, committed.Error())
	}
	for p := int32(0); p < franzPartitions; p++ {
		if got, ok := committed.Lookup(topic, p); !ok || got.At != ends[p] {
			t.Fatalf("committed offset of partition %d: %+v, want the end offset %d", p, got, ends[p])
		}
	}
	lag, err := adm.Lag(ctx, group)
	if err != nil {
		t.Fatalf("Lag: %v", err)
	}
	if l := lag[group]; l.Error() != nil || l.Lag.Total() != 0 {
		t.Fatalf("the group's lag after reading everything: %d (err %v)", l.Lag.Total(), l.Error())
	}
	a.cl.Close()
	waitFor(t, "the group is empty once both left", 30*time.Second, func() error {
		dg, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return err
		}
		if d := dg[group]; d.State != "Empty" || len(d.Members) != 0 {
			return fmt.Errorf("state %q with %d members", d.State, len(d.Members))
		}
		return nil
	})
	t.Logf("franz-go: %d records over %d partitions (%v); b read %d before leaving, a %d", franzRecords, franzPartitions, ends, bRead, a.read)
}

// waitTopicEverywhere waits until every broker's own metadata shows topic with the
// given number of partitions, each with a leader. Brokers learn of a new topic or new
// partitions after the coordinator has answered the admin request (in Kafka too); a
// request to a broker that has not learnt it yet gets UNKNOWN_TOPIC_OR_PARTITION.
func waitTopicEverywhere(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, partitions int) {
	t.Helper()
	adm := kadm.NewClient(cl)
	waitFor(t, fmt.Sprintf("every broker knows %s with %d partitions", topic, partitions), 30*time.Second, func() error {
		md, err := adm.BrokerMetadata(ctx)
		if err != nil {
			return err
		}
		for _, b := range md.Brokers {
			req := kmsg.NewPtrMetadataRequest()
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(topic)
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, cl.Broker(int(b.NodeID)))
			if err != nil {
				return fmt.Errorf("broker %d: %w", b.NodeID, err)
			}
			if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 || len(resp.Topics[0].Partitions) != partitions {
				return fmt.Errorf("broker %d: %+v", b.NodeID, resp.Topics)
			}
			for _, p := range resp.Topics[0].Partitions {
				if p.ErrorCode != 0 || p.Leader < 0 {
					return fmt.Errorf("broker %d: partition %d leader %d error %d", b.NodeID, p.Partition, p.Leader, p.ErrorCode)
				}
			}
		}
		return nil
	})
}
