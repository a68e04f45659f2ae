#!/usr/bin/perl
# Checks META.json against the PGXN Meta Spec 1.0.0 (https://pgxn.org/meta/spec.txt):
# required keys, the type and form of every key it knows, and that the
# versions agree with idem.control and debian/changelog.  Prints every
# problem; exits 1 if there is one.
#
#   perl test/package/meta.pl DIR     (DIR: the top of the source tree)
use strict;
use warnings;
use JSON::PP;

my $dir = shift // '.';
my @errors;
sub err { push @errors, join('', @_) }

sub slurp
{
	my ($path) = @_;
	open my $fh, '<', $path or die "cannot read $path: $!\n";
	local $/;
	return <$fh>;
}

my $meta = eval { JSON::PP->new->decode(slurp("$dir/META.json")) };
if (!$meta)
{
	print "META.json: not valid JSON: $@";
	exit 1;
}

my $semver = qr/^(?:0|[1-9]\d*)\.(?:0|[1-9]\d*)\.(?:0|[1-9]\d*)
	(?:-(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?
	(?:\+[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*)?$/x;
my $term = qr/^[^\/\\\s\p{Cntrl}]{2,}$/;
my $custom = qr/^x_./i;
my %licenses = map { $_ => 1 } qw(agpl_3 apache_1_1 apache_2_0 artistic_1 artistic_2 bsd
  freebsd gfdl_1_2 gfdl_1_3 gpl_1 gpl_2 gpl_3 lgpl_2_1 lgpl_3_0 mit mozilla_1_0 mozilla_1_1
  openssl perl_5 postgresql qpl_1_0 ssleay sun zlib open_source restricted unrestricted unknown);

sub is_string { defined $_[0] && !ref $_[0] && length $_[0] > 0 }
sub is_map { ref $_[0] eq 'HASH' }
sub is_uri { is_string($_[0]) && $_[0] =~ m{^[a-z][a-z0-9+.-]*:\S+$}i }

# Keys of a map that the spec does not define (custom x_ keys are allowed).
sub unknown_keys
{
	my ($where, $map, @known) = @_;
	my %k = map { $_ => 1 } @known;
	err("$where: unknown key \"$_\"") for grep { !$k{$_} && !/$custom/ } sort keys %$map;
}

sub check_path
{
	my ($where, $path) = @_;
	if (!is_string($path) || length $path < 2 || $path =~ m{^/|\\|(^|/)\.\.(/|$)})
	{
		err("$where: not a relative path in unix form");
	}
	elsif (!-f "$dir/$path")
	{
		err("$where: $path is not a file of the distribution");
	}
}

sub check_version_range
{
	my ($where, $range) = @_;
	return if defined $range && !ref $range && $range eq '0';
	my $ok = is_string($range);
	for my $part (split /\s*,\s*/, $ok ? $range : '')
	{
		my ($v) = $part =~ /^(?:(?:[=!]=|[<>]=?)\s*)?(.*)$/;
		$ok = 0 unless $v =~ $semver;
	}
	err("$where: not a version range") unless $ok;
}

unknown_keys('top level', $meta, qw(name version abstract maintainer license provides meta-spec
  description generated_by tags no_index prereqs release_status resources));
for my $k (qw(name version abstract maintainer license provides meta-spec))
{
	err("required key \"$k\" missing") unless exists $meta->{$k};
}

err('name: not a term') if exists $meta->{name} && !(is_string($meta->{name}) && $meta->{name} =~ $term);
err('version: not a semantic version') if exists $meta->{version} && !(is_string($meta->{version}) && $meta->{version} =~ $semver);
for my $k (qw(abstract description generated_by))
{
	err("$k: not a non-empty string") if exists $meta->{$k} && !is_string($meta->{$k});
}

if (exists $meta->{maintainer})
{
	my $m = $meta->{maintainer};
	my @m = ref $m eq 'ARRAY' ? @$m : ($m);
	my %seen;
	err('maintainer: not a string or a list of strings')
	  if !@m || grep { !is_string($_) || $seen{$_}++ } @m;
}

if (exists $meta->{license})
{
	my $l = $meta->{license};
	if (is_map($l))
	{
		err('license: no license named') unless %$l;
		err("license: \"$_\" has no URI") for grep { !is_uri($l->{$_}) } sort keys %$l;
	}
	else
	{
		my @l = ref $l eq 'ARRAY' ? @$l : ($l);
		err('license: not a license of the spec') if !@l || grep { !is_string($_) || !$licenses{$_} } @l;
	}
}

if (exists $meta->{provides})
{
	my $p = $meta->{provides};
	if (!is_map($p) || !%$p)
	{
		err('provides: not a map of extensions');
	}
	else
	{
		for my $ext (sort keys %$p)
		{
			my $e = $p->{$ext};
			err("provides: \"$ext\" is not a term") unless $ext =~ $term;
			if (!is_map($e))
			{
				err("provides.$ext: not a map");
				next;
			}
			unknown_keys("provides.$ext", $e, qw(file version abstract docfile docpath));
			check_path("provides.$ext.file", $e->{file});
			check_path("provides.$ext.docfile", $e->{docfile}) if exists $e->{docfile};
			err("provides.$ext.version: not a semantic version")
			  unless is_string($e->{version}) && $e->{version} =~ $semver;
			err("provides.$ext.abstract: not a non-empty string")
			  if exists $e->{abstract} && !is_string($e->{abstract});
		}
	}
}

if (exists $meta->{'meta-spec'})
{
	my $s = $meta->{'meta-spec'};
	if (!is_map($s))
	{
		err('meta-spec: not a map');
	}
	else
	{
		unknown_keys('meta-spec', $s, qw(version url));
		err('meta-spec.version: not 1.0.x') unless is_string($s->{version}) && $s->{version} =~ /^1\.0\.\d+$/;
		err('meta-spec.url: not the spec\'s address')
		  if exists $s->{url} && !(is_string($s->{url}) && $s->{url} =~ m{^https?://pgxn\.org/meta/spec\.txt$});
	}
}

if (exists $meta->{prereqs})
{
	my $pr = $meta->{prereqs};
	if (!is_map($pr) || !%$pr)
	{
		err('prereqs: not a map of phases');
	}
	else
	{
		unknown_keys('prereqs', $pr, qw(configure build test runtime develop));
		for my $phase (sort grep { !/$custom/ } keys %$pr)
		{
			my $ph = $pr->{$phase};
			if (!is_map($ph) || !grep { exists $ph->{$_} } qw(requires recommends suggests conflicts))
			{
				err("prereqs.$phase: no relationship");
				next;
			}
			unknown_keys("prereqs.$phase", $ph, qw(requires recommends suggests conflicts));
			for my $rel (sort grep { !/$custom/ } keys %$ph)
			{
				my $r = $ph->{$rel};
				if (!is_map($r) || !%$r)
				{
					err("prereqs.$phase.$rel: not a map of prerequisites");
					next;
				}
				for my $name (sort keys %$r)
				{
					err("prereqs.$phase.$rel: \"$name\" is not a term") unless $name =~ $term;
					check_version_range("prereqs.$phase.$rel.$name", $r->{$name});
				}
			}
		}
	}
}

err('release_status: not stable, testing or unstable')
  if exists $meta->{release_status}
  && !(is_string($meta->{release_status}) && $meta->{release_status} =~ /^(stable|testing|unstable)$/);

if (exists $meta->{resources})
{
	my $r = $meta->{resources};
	if (!is_map($r) || !%$r)
	{
		err('resources: not a map of resources');
	}
	else
	{
		unknown_keys('resources', $r, qw(homepage bugtracker repository));
		err('resources.homepage: not a URI') if exists $r->{homepage} && !is_uri($r->{homepage});
		if (exists $r->{bugtracker})
		{
			my $b = $r->{bugtracker};
			if (!is_map($b) || !(exists $b->{web} || exists $b->{mailto}))
			{
				err('resources.bugtracker: neither web nor mailto');
			}
			else
			{
				unknown_keys('resources.bugtracker', $b, qw(web mailto));
				err('resources.bugtracker.web: not a URI') if exists $b->{web} && !is_uri($b->{web});
				err('resources.bugtracker.mailto: not an address')
				  if exists $b->{mailto} && !(is_string($b->{mailto}) && $b->{mailto} =~ /^[^@\s]+@[^@\s]+\.[^@\s]+$/);
			}
		}
		if (exists $r->{repository})
		{
			my $g = $r->{repository};
			if (!is_map($g) || !((exists $g->{url} && exists $g->{type}) || exists $g->{web}))
			{
				err('resources.repository: neither url and type nor web');
			}
			else
			{
				unknown_keys('resources.repository', $g, qw(url web type));
				err("resources.repository.$_: not a URI") for grep { exists $g->{$_} && !is_uri($g->{$_}) } qw(url web);
				err('resources.repository.type: not a lowercase word')
				  if exists $g->{type} && !(is_string($g->{type}) && $g->{type} =~ /^\p{Lower}+$/);
			}
		}
	}
}

if (exists $meta->{tags})
{
	my $t = $meta->{tags};
	my %seen;
	err('tags: not a list of distinct tags')
	  if ref $t ne 'ARRAY' || !@$t
	  || grep { !is_string($_) || length > 255 || !/^[^\/\\\p{Cntrl}]{2,}$/ || $seen{$_}++ } @$t;
}

# The versions the package, the extension and PGXN see must be one.
my ($control) = slurp("$dir/idem.control") =~ /^default_version\s*=\s*'([^']*)'/m;
my ($debian) = slurp("$dir/debian/changelog") =~ /^\S+ \(([^)]*)\)/;
(my $upstream = $debian // '') =~ s/-[^-]*$//;
my $v = $meta->{version} // '';
err("version: $v, but idem.control says default_version '$control'") unless ($control // '') eq $v;
err("version: $v, but debian/changelog says $debian") unless $upstream eq $v;
err("provides.idem.version: not the distribution's version $v")
  unless is_map($meta->{provides}) && is_map($meta->{provides}{idem}) && ($meta->{provides}{idem}{version} // '') eq $v;

if (@errors)
{
	print "META.json: $_\n" for @errors;
	exit 1;
}
print "META.json: valid for PGXN Meta Spec 1.0.0, version $v as in idem.control and debian/changelog\n";
exit 0;
