package netlimit

// queue is an oldest-first list of connections threaded through a link of
// each (intrusive), so that moving a connection in and out of it — twice
// per request for an HTTP keep-alive, idle then active — allocates nothing.
// A connection sits in two queues at once, the limiter's and its address's,
// each through a link of its own.
type queue struct {
	head, tail *conn
	// link picks the connection's link this queue is threaded through.
	link func(*conn) *link
}

type link struct{ prev, next *conn }

func allLink(c *conn) *link  { return &c.all }
func mineLink(c *conn) *link { return &c.mine }

// front is the oldest connection, nil when the queue is empty.
func (q *queue) front() *conn { return q.head }

// push adds c as the newest.
func (q *queue) push(c *conn) {
	l := q.link(c)
	l.prev, l.next = q.tail, nil
	if q.tail != nil {
		q.link(q.tail).next = c
	} else {
		q.head = c
	}
	q.tail = c
}

// remove takes c out; c must be in q.
func (q *queue) remove(c *conn) {
	l := q.link(c)
	if l.prev != nil {
		q.link(l.prev).next = l.next
	} else {
		q.head = l.next
	}
	if l.next != nil {
		q.link(l.next).prev = l.prev
	} else {
		q.tail = l.prev
	}
	l.prev, l.next = nil, nil
}
