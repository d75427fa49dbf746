package warble

// Node is anything a global id can name: a *User or a *Post.
type Node interface{ isNode() }

func (*User) isNode() {}
func (*Post) isNode() {}

// IsPostID reports whether id has the form of a post id rather than a user
// id. Post ids are "<author id>:<seq>", so that a post's keys can live in its
// author's Redis Cluster hash slot; user ids are decimal numbers.
func IsPostID(id string) bool {
	author, seq, ok := cutPostID(id)
	return ok && ValidUserID(author) && ValidUserID(seq)
}

// PostAuthorID returns the author id a post id carries, or "" if id is not
// a post id.
func PostAuthorID(id string) string {
	if !IsPostID(id) {
		return ""
	}
	author, _, _ := cutPostID(id)
	return author
}

func cutPostID(id string) (author, seq string, ok bool) {
	for i := 0; i < len(id); i++ {
		if id[i] == ':' {
			return id[:i], id[i+1:], true
		}
	}
	return "", "", false
}
