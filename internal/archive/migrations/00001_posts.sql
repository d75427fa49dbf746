-- The posts that left Redis. A post's seq is unique across Warble (one
-- INCR), so it is the primary key, and the newest posts of everyone before
-- a cursor are a range scan of it; posts_by_author makes an author's posts
-- before a cursor a range scan too. Ids are decimal digits, below 10^18.
-- body holds up to 280 code points, as Warble's MaxPostLen counts them;
-- utf8mb4_bin compares bytes, as Redis does. created_at is unix ms.

-- +goose Up
CREATE TABLE posts (
  seq        BIGINT UNSIGNED NOT NULL,
  author_id  BIGINT UNSIGNED NOT NULL,
  body       VARCHAR(280) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (seq),
  KEY posts_by_author (author_id, seq)
) ENGINE=InnoDB;

-- +goose Down
DROP TABLE posts;
