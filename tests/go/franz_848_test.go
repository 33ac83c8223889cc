package spatego

// franz-go's KIP-848 consumer group (kgo.ServerSideBalancer: the broker's coordinator
// runs the assignor and members reconcile through ConsumerGroupHeartbeat): three members
// subscribed by a regular expression, a topic created later picked up by the broker's
// regex resolution, a member that commits and leaves, and its partitions taken over from
// its commits. Every record is read exactly once, in offset order per partition, and the
// committed offsets end at the log end offsets.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type topicPartition struct {
	topic     string
	partition int32
}

type member848 struct {
	name     string
	cl       *kgo.Client
	mu       sync.Mutex
	assigned map[topicPartition]bool
	lastOff  map[topicPartition]int64
	read     int
	once     sync.Once
}

// close leaves the group (a KIP-848 leave heartbeat); once, however often it is called.
func (m *member848) close() { m.once.Do(m.cl.Close) }

func newMember848(t *testing.T, e env, name, group, regex string) *member848 {
	m := &member848{name: name, assigned: map[topicPartition]bool{}, lastOff: map[topicPartition]int64{}}
	m.cl = newFranz(t, e,
		kgo.ConsumerGroup(group),
		kgo.ConsumeRegex(),
		kgo.ConsumeTopics(regex),
		kgo.ServerSideBalancer(),
		kgo.DisableAutoCommit(),
		kgo.ClientID(name),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for topic, ps := range a {
				for _, p := range ps {
					m.assigned[topicPartition{topic, p}] = true
				}
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for topic, ps := range r {
				for _, p := range ps {
					delete(m.assigned, topicPartition{topic, p})
				}
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, l map[string][]int32) {
			t.Errorf("%s lost partitions %v (session expired or fenced)", name, l)
		}),
	)
	return m
}

func (m *member848) owned() []topicPartition {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]topicPartition, 0, len(m.assigned))
	for tp := range m.assigned {
		out = append(out, tp)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].topic < out[j].topic || out[i].topic == out[j].topic && out[i].partition < out[j].partition
	})
	return out
}

// TestFranzNextGenGroup: see the file's comment.
func TestFranzNextGenGroup(t *testing.T) {
	e := loadEnv(t)
	ctx := testContext(t)
	cl := newFranz(t, e)
	defer cl.Close()
	adm := kadm.NewClient(cl)

	prefix := uniqueName("kip848")
	regex := "^" + prefix + "-.*"
	written := map[topicPartition]map[int64]string{}
	total := 0
	create := func(topic string, partitions int32) {
		created, err := adm.CreateTopics(ctx, partitions, e.replicationFactor, nil, topic)
		if err != nil || created[topic].Err != nil {
			t.Fatalf("CreateTopics %s: %v %+v", topic, err, created[topic])
		}
		waitTopicEverywhere(t, ctx, cl, topic, int(partitions))
	}
	produce := func(topic string, n int) {
		records := make([]*kgo.Record, n)
		for i := range records {
			records[i] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("%s-%d-%d", topic, total, i))}
		}
		for _, r := range cl.ProduceSync(ctx, records...) {
			if r.Err != nil {
				t.Fatalf("produce to %s: %v", topic, r.Err)
			}
			tp := topicPartition{r.Record.Topic, r.Record.Partition}
			if written[tp] == nil {
				written[tp] = map[int64]string{}
			}
			written[tp][r.Record.Offset] = string(r.Record.Value)
		}
		total += n
	}
	topicA, topicB := prefix+"-a", prefix+"-b"
	create(topicA, 6)
	produce(topicA, 1200)

	seen := map[topicPartition]map[int64]bool{}
	read := 0
	var seenMu sync.Mutex
	poll := func(m *member848) {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		fs := m.cl.PollRecords(pctx, 200)
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: fetch error on %s/%d: %v", m.name, topic, p, err)
			}
		})
		seenMu.Lock()
		defer seenMu.Unlock()
		m.mu.Lock()
		defer m.mu.Unlock()
		fs.EachRecord(func(r *kgo.Record) {
			tp := topicPartition{r.Topic, r.Partition}
			if want, ok := written[tp][r.Offset]; !ok || want != string(r.Value) {
				t.Fatalf("%s read %s/%d at %d as %q; written: %q (known: %v)", m.name, r.Topic, r.Partition, r.Offset, r.Value, want, ok)
			}
			if last, ok := m.lastOff[tp]; ok && r.Offset != last+1 {
				t.Fatalf("%s read %s/%d at %d after %d: skipped or went back", m.name, r.Topic, r.Partition, r.Offset, last)
			}
			m.lastOff[tp] = r.Offset
			if seen[tp] == nil {
				seen[tp] = map[int64]bool{}
			}
			if seen[tp][r.Offset] {
				t.Fatalf("%s read %s/%d at %d, which the group had already read", m.name, r.Topic, r.Partition, r.Offset)
			}
			seen[tp][r.Offset] = true
			m.read++
			read++
		})
	}
	readAll := func(what string, members ...*member848) {
		waitFor(t, what, 60*time.Second, func() error {
			for _, m := range members {
				poll(m)
			}
			if read < total {
				return fmt.Errorf("the group read %d of %d", read, total)
			}
			return nil
		})
	}
	// Each partition of the matching topics owned by exactly one of members.
	ownedOnce := func(partitions int, members ...*member848) error {
		owner := map[topicPartition]string{}
		for _, m := range members {
			ps := m.owned()
			if len(ps) == 0 {
				return fmt.Errorf("%s owns nothing", m.name)
			}
			for _, tp := range ps {
				if o, ok := owner[tp]; ok {
					return fmt.Errorf("%v owned by %s and %s", tp, o, m.name)
				}
				owner[tp] = m.name
			}
		}
		if len(owner) != partitions {
			return fmt.Errorf("%d partitions owned, want %d: %v", len(owner), partitions, owner)
		}
		return nil
	}

	group := uniqueName("franz-848")
	a := newMember848(t, e, "member-a", group, regex)
	defer a.close()
	waitFor(t, "a alone owns every partition", 60*time.Second, func() error { return ownedOnce(6, a) })
	b := newMember848(t, e, "member-b", group, regex)
	defer b.close()
	c := newMember848(t, e, "member-c", group, regex)
	defer c.close()
	waitFor(t, "a, b and c split the partitions", 60*time.Second, func() error { return ownedOnce(6, a, b, c) })

	dg, err := adm.DescribeConsumerGroups(ctx, group)
	if err != nil || dg.Error() != nil {
		t.Fatalf("DescribeConsumerGroups: %v %v", err, dg.Error())
	}
	d := dg[group]
	if d.State != "Stable" || d.AssignorName != "uniform" || len(d.Members) != 3 {
		t.Fatalf("DescribeConsumerGroups %s: state %q assignor %q, %d members; want Stable, uniform, 3", group, d.State, d.AssignorName, len(d.Members))
	}
	for _, m := range d.Members {
		// (kgo wraps the pattern for RE2/J's whole-name match: `.*(?:(?:REGEX)).*`.)
		if m.SubscribedTopicRegex == nil || !strings.Contains(*m.SubscribedTopicRegex, regex) {
			t.Fatalf("member %s subscribes to %q, want the regex %q", m.MemberID, deref(m.SubscribedTopicRegex), regex)
		}
	}
	readAll("the group reads the first topic", a, b, c)

	// A topic created now matches the regex: the broker assigns it.
	create(topicB, 3)
	produce(topicB, 600)
	waitFor(t, "the members own the new topic's partitions too", 60*time.Second, func() error {
		poll(a)
		poll(b)
		poll(c)
		return ownedOnce(9, a, b, c)
	})
	readAll("the group reads the new topic", a, b, c)

	// c commits what it read and leaves; a and b take its partitions over from there.
	if err := c.cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("c's commit: %v", err)
	}
	c.close()
	waitFor(t, "a and b own c's partitions", 60*time.Second, func() error {
		poll(a)
		poll(b)
		return ownedOnce(9, a, b)
	})
	produce(topicA, 600)
	produce(topicB, 300)
	readAll("a and b read what was written after c left", a, b)

	for _, m := range []*member848{a, b} {
		if err := m.cl.CommitUncommittedOffsets(ctx); err != nil {
			t.Fatalf("%s's commit: %v", m.name, err)
		}
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil || committed.Error() != nil {
		t.Fatalf("FetchOffsets: %v %v", err, committed.Error())
	}
	ends, err := adm.ListEndOffsets(ctx, topicA, topicB)
	if err != nil || ends.Error() != nil {
		t.Fatalf("ListEndOffsets: %v %v", err, ends.Error())
	}
	ends.Each(func(o kadm.ListedOffset) {
		if got, ok := committed.Lookup(o.Topic, o.Partition); !ok || got.At != o.Offset {
			t.Fatalf("committed offset of %s/%d: %+v, want the end offset %d", o.Topic, o.Partition, got, o.Offset)
		}
	})
	a.close()
	b.close()
	waitFor(t, "the group is empty once every member left", 30*time.Second, func() error {
		dg, err := adm.DescribeConsumerGroups(ctx, group)
		if err != nil {
			return err
		}
		if d := dg[group]; d.Err != nil || d.State != "Empty" || len(d.Members) != 0 {
			return fmt.Errorf("state %q with %d members (err %v)", d.State, len(d.Members), d.Err)
		}
		return nil
	})
	t.Logf("franz-go KIP-848: %d records over 9 partitions; a read %d, b %d, c %d before leaving", total, a.read, b.read, c.read)
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
